#pragma once
/// \file troupe.hpp
/// All of Troupe in one include: tensors, autograd, the runtime (nodes, RPC, RRefs, spawn),
/// distributed autograd and DDP. Link `troupe::troupe` (find_package(troupe CONFIG REQUIRED)).
/// A program that needs one layer can include that layer's header and link its target:
///
///   <troupe/tensors.hpp>        troupe::tensors
///   <troupe/autograd.hpp>       troupe::autograd
///   <troupe/actors.hpp>         troupe::actors
///   <troupe/dist_autograd.hpp>  troupe::dist_autograd
///   <troupe/ddp.hpp>            troupe::ddp

#include "troupe/actors.hpp"
#include "troupe/autograd.hpp"
#include "troupe/ddp.hpp"
#include "troupe/dist_autograd.hpp"
#include "troupe/tensors.hpp"

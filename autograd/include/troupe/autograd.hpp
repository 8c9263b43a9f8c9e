#pragma once
/// \file autograd.hpp
/// Local autograd in one include: requires_grad, backward and hooks on tensors, gradient
/// checking, `nn` modules and losses, optimizers and training checkpoints.
/// Link `troupe::autograd`.

#include "troupe/autograd/checkpoint.hpp"
#include "troupe/autograd/gradcheck.hpp"
#include "troupe/autograd/nn/activation.hpp"
#include "troupe/autograd/nn/dropout.hpp"
#include "troupe/autograd/nn/embedding.hpp"
#include "troupe/autograd/nn/layer_norm.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/nn/module.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors.hpp"

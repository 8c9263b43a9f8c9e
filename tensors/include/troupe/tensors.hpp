#pragma once
/// \file tensors.hpp
/// The tensor library in one include: tensors, dtypes, devices, factories, ops, random
/// generators, CUDA device queries and tensor files (Boost archives, safetensors).
/// Link `troupe::tensors`.

#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/device.hpp"
#include "troupe/tensors/dtype.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/half.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/nn_ops.hpp"
#include "troupe/tensors/reduction.hpp"
#include "troupe/tensors/safetensors.hpp"
#include "troupe/tensors/serialization.hpp"
#include "troupe/tensors/state_dict.hpp"
#include "troupe/tensors/tensor.hpp"

#pragma once
/// \file variable.hpp
/// The user API of local autograd on tensors (PyTorch's Tensor.requires_grad_, .grad,
/// .backward(), hooks). Free functions in namespace troupe. All run on the calling thread;
/// none blocks except `backward`, which runs the whole backward pass before returning.

#include <cstdint>
#include <functional>
#include <memory>

#include "troupe/autograd/hook_handle.hpp"
#include "troupe/autograd/grad_node.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// Marks a leaf as requiring grad (or not) and returns it. Throws autograd_error for a non-leaf
/// ("use detach()"), dtype_mismatch when turning it on for a non-floating-point tensor.
tensor& set_requires_grad(tensor& t, bool on = true);
/// The tensor's accumulated gradient (.grad); undefined if none.
tensor grad(const tensor& t);
/// Sets .grad (undefined clears it). Throws shape_mismatch / dtype_mismatch / device_mismatch
/// if `g` does not match `t`.
void set_grad(const tensor& t, tensor g);
/// True if `t` has no grad_fn (every tensor that does not require grad is a leaf).
bool is_leaf(const tensor& t);
/// The node that produced `t` (null for a leaf).
std::shared_ptr<grad_node> grad_fn(const tensor& t);
/// Which output of grad_fn(t) `t` is (0 for a leaf).
std::uint32_t output_nr(const tensor& t);
/// Makes a non-leaf keep its gradient in .grad during backward (no-op on a leaf).
/// Throws autograd_error if `t` does not require grad.
void retain_grad(const tensor& t);
/// Registers a hook on the gradient of `t`: it may return a replacement gradient, or an
/// undefined tensor to keep the gradient. On a leaf it runs before accumulation into .grad.
/// Throws autograd_error if `t` does not require grad.
hook_handle register_hook(const tensor& t, std::function<tensor(const tensor&)> hook);
/// Registers a hook run after the leaf's .grad was updated, once per backward pass; it receives
/// the leaf itself (read the accumulated gradient with grad(leaf)), as PyTorch's. Throws
/// autograd_error for a non-leaf or a tensor that does not require grad.
hook_handle register_post_accumulate_grad_hook(const tensor& leaf, std::function<void(const tensor&)> hook);
/// Computes the gradients of `root` w.r.t. the leaves of its graph and accumulates them into
/// their .grad (a temporary engine, on the calling thread). `grad_root` defaults to ones for a
/// one-element root. Without `retain_graph` the graph's saved tensors are freed.
/// Throws autograd_error (see engine::backward) or the error of a failing backward formula.
void backward(const tensor& root, const tensor& grad_root = {}, bool retain_graph = false);
/// Zeroes .grad in place (keeps its storage, so views of it held by others see zeros);
/// does nothing if `t` has no gradient.
void zero_grad(tensor& t);

}  // namespace troupe

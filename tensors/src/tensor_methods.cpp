// Method and operator forms of the free-function ops.
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

tensor tensor::add(const tensor& o) const { return troupe::add(*this, o); }
tensor tensor::sub(const tensor& o) const { return troupe::sub(*this, o); }
tensor tensor::mul(const tensor& o) const { return troupe::mul(*this, o); }
tensor tensor::div(const tensor& o) const { return troupe::div(*this, o); }
tensor tensor::pow(double e) const { return troupe::pow(*this, e); }
tensor tensor::neg() const { return troupe::neg(*this); }
tensor tensor::abs() const { return troupe::abs(*this); }
tensor tensor::exp() const { return troupe::exp(*this); }
tensor tensor::log() const { return troupe::log(*this); }
tensor tensor::sqrt() const { return troupe::sqrt(*this); }
tensor tensor::rsqrt() const { return troupe::rsqrt(*this); }
tensor tensor::relu() const { return troupe::relu(*this); }
tensor tensor::sigmoid() const { return troupe::sigmoid(*this); }
tensor tensor::tanh() const { return troupe::tanh(*this); }
tensor tensor::matmul(const tensor& o) const { return troupe::matmul(*this, o); }
tensor tensor::sum() const { return troupe::sum(*this); }
tensor tensor::sum(shape_t dims, bool keepdim) const { return troupe::sum(*this, std::move(dims), keepdim); }
tensor tensor::mean() const { return troupe::mean(*this); }
tensor tensor::mean(shape_t dims, bool keepdim) const { return troupe::mean(*this, std::move(dims), keepdim); }

tensor operator+(const tensor& a, const tensor& b) { return add(a, b); }
tensor operator-(const tensor& a, const tensor& b) { return sub(a, b); }
tensor operator*(const tensor& a, const tensor& b) { return mul(a, b); }
tensor operator/(const tensor& a, const tensor& b) { return div(a, b); }
tensor operator+(const tensor& a, double b) { return add(a, b); }
tensor operator-(const tensor& a, double b) { return sub(a, b); }
tensor operator*(const tensor& a, double b) { return mul(a, b); }
tensor operator/(const tensor& a, double b) { return div(a, b); }
tensor operator+(double a, const tensor& b) { return add(b, a); }
tensor operator-(double a, const tensor& b) { return rsub(b, a); }
tensor operator*(double a, const tensor& b) { return mul(b, a); }
tensor operator/(double a, const tensor& b) { return rdiv(b, a); }
tensor operator-(const tensor& a) { return neg(a); }

}  // namespace troupe

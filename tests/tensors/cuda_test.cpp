// The CUDA backend against the CPU backend: every op through the public API on cuda:0 versus
// the same op on CPU. They run over shapes (broadcasting, zero-size), layouts (transposed,
// strided, expanded) and dtypes. Also: random draws; streams, events, the caching allocator
// and transfers.
// Every test skips cleanly (with a warning) when no CUDA device is visible.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/nn_ops.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;

namespace {

bool no_cuda() {
  if (cuda::device_count() > 0) return false;
  WARN("no CUDA device: skipped");
  return true;
}

const device gpu = cuda_device(0);

// Per-dtype tolerance against the CPU result (both computed in the dtype).
double tol(dtype t) {
  switch (t) {
    case dtype::float64: return 1e-10;
    case dtype::float32: return 1e-5;
    case dtype::float16: return 2e-3;
    case dtype::bfloat16: return 1.6e-2;
    default: return 0.0;
  }
}

// `got` (on CUDA) equals `want` (on CPU) in shape, dtype and values (within tol(dtype)).
void require_match(const tensor& got, const tensor& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.is_cuda());
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const tensor g = got.cpu().to(dtype::float64), w = want.to(dtype::float64);
  const double t = tol(want.dtype());
  const bool ok = allclose(g, w, t, t, true);
  INFO((ok ? std::string() : "cuda " + g.to_string() + "\ncpu  " + w.to_string()));
  CHECK(ok);
}

// Random values of dtype t (integers in [-4, 5), floats in [-2, 2)).
tensor sample(const shape_t& shape, dtype t, std::uint64_t seed, double low = -2.0, double high = 2.0) {
  generator gen(seed);
  if (is_floating(t)) return rand(shape, gen, tensor_options(t), low, high);
  if (t == dtype::boolean) return gt(randint(0, 2, shape, gen), 0.0);
  return randint(t == dtype::uint8 ? 0 : -4, 5, shape, gen, tensor_options(t));
}

// The layouts a test runs on: contiguous, a transposed view, a stepped slice.
std::vector<std::pair<std::string, tensor>> layouts(const tensor& base) {
  std::vector<std::pair<std::string, tensor>> out{{"contiguous", base}};
  if (base.dim() >= 2) out.emplace_back("transposed", base.transpose(0, 1).contiguous().transpose(0, 1));
  if (base.dim() >= 1 && base.size(-1) > 0) {
    shape_t wide = base.shape();
    wide.back() *= 2;
    const tensor w = sample(wide, base.dtype(), 99);
    tensor s = w.slice(-1, 0, wide.back(), 2);
    s.copy_(base);
    out.emplace_back("strided", s);
  }
  return out;
}

const std::vector<dtype> all_numeric = {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16,
                                        dtype::int32, dtype::int64};
const std::vector<dtype> floats = {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16};

}  // namespace

TEST_CASE("cuda binary ops match the cpu across shapes, broadcasting, layouts and dtypes", "[tensors][cuda]") {
  if (no_cuda()) return;
  const std::vector<std::pair<shape_t, shape_t>> shapes = {
      {{3, 4}, {3, 4}}, {{2, 3, 4}, {4}}, {{5, 1}, {1, 6}}, {{0, 3}, {3}}, {{}, {7}}, {{1000, 33}, {1000, 33}}};
  const std::vector<std::pair<std::string, std::function<tensor(const tensor&, const tensor&)>>> ops = {
      {"add", [](const tensor& a, const tensor& b) { return add(a, b, 2.0); }},
      {"sub", [](const tensor& a, const tensor& b) { return sub(a, b); }},
      {"mul", [](const tensor& a, const tensor& b) { return mul(a, b); }},
      {"div", [](const tensor& a, const tensor& b) { return div(a, add(abs(b), 1.0)); }},
      {"maximum", [](const tensor& a, const tensor& b) { return maximum(a, b); }},
      {"minimum", [](const tensor& a, const tensor& b) { return minimum(a, b); }},
      {"add_scalar", [](const tensor& a, const tensor&) { return add(a, 3.0); }},
      {"mul_scalar", [](const tensor& a, const tensor&) { return mul(a, -2.0); }},
  };
  for (dtype t : all_numeric)
    for (const auto& [sa, sb] : shapes)
      for (const auto& [la, a] : layouts(sample(sa, t, 1)))
        for (const auto& [name, op] : ops) {
          const tensor b = sample(sb, t, 2);
          require_match(op(a.to(gpu), b.to(gpu)), op(a, b),
                        name + " " + std::string(to_string(t)) + " " + la + " " + shape_to_string(sa) + " " + shape_to_string(sb));
        }
}

TEST_CASE("cuda pow and in-place ops match the cpu", "[tensors][cuda]") {
  if (no_cuda()) return;
  for (dtype t : floats) {
    const tensor a = sample({4, 5}, t, 3, 0.5, 2.0), b = sample({5}, t, 4, -1.0, 2.0);
    require_match(pow(a.to(gpu), b.to(gpu)), pow(a, b), "pow " + std::string(to_string(t)));
    require_match(pow(a.to(gpu), 2.0), pow(a, 2.0), "pow scalar");
    tensor x = a.clone(), xg = a.to(gpu);
    x.add_(b, 0.5).mul_(3.0);
    xg.add_(b.to(gpu), 0.5).mul_(3.0);
    require_match(xg, x, "add_ then mul_");
  }
}

TEST_CASE("cuda unary ops match the cpu for every float dtype and layout", "[tensors][cuda]") {
  if (no_cuda()) return;
  const std::vector<std::pair<std::string, std::function<tensor(const tensor&)>>> ops = {
      {"neg", [](const tensor& a) { return neg(a); }},        {"abs", [](const tensor& a) { return abs(a); }},
      {"exp", [](const tensor& a) { return exp(a); }},        {"log", [](const tensor& a) { return log(abs(a)); }},
      {"sqrt", [](const tensor& a) { return sqrt(abs(a)); }}, {"rsqrt", [](const tensor& a) { return rsqrt(add(abs(a), 0.1)); }},
      {"relu", [](const tensor& a) { return relu(a); }},      {"sigmoid", [](const tensor& a) { return sigmoid(a); }},
      {"tanh", [](const tensor& a) { return tanh(a); }},      {"gelu", [](const tensor& a) { return gelu(a); }},
      {"sign", [](const tensor& a) { return sign(a); }},
  };
  for (dtype t : floats)
    for (const shape_t& s : {shape_t{7, 9}, shape_t{0, 4}, shape_t{}, shape_t{3, 100, 5}})
      for (const auto& [la, a] : layouts(sample(s, t, 5)))
        for (const auto& [name, op] : ops)
          require_match(op(a.to(gpu)), op(a), name + " " + std::string(to_string(t)) + " " + la + " " + shape_to_string(s));
  for (dtype t : {dtype::int32, dtype::int64}) {
    const tensor a = sample({6, 7}, t, 6);
    require_match(neg(a.to(gpu)), neg(a), "neg int");
    require_match(abs(a.to(gpu)), abs(a), "abs int");
    require_match(relu(a.to(gpu)), relu(a), "relu int");
  }
}

TEST_CASE("cuda comparisons and where match the cpu", "[tensors][cuda]") {
  if (no_cuda()) return;
  for (dtype t : all_numeric) {
    const tensor a = sample({4, 6}, t, 7), b = sample({6}, t, 8);
    const tensor ag = a.to(gpu), bg = b.to(gpu);
    require_match(eq(ag, bg), eq(a, b), "eq");
    require_match(ne(ag, bg), ne(a, b), "ne");
    require_match(lt(ag, bg), lt(a, b), "lt");
    require_match(le(ag, bg), le(a, b), "le");
    require_match(gt(ag.transpose(0, 1), 0.5), gt(a.transpose(0, 1), 0.5), "gt scalar transposed");
    require_match(ge(ag, bg), ge(a, b), "ge");
    const tensor c = gt(a, b);
    require_match(where(c.to(gpu), ag, bg), where(c, a, b), "where " + std::string(to_string(t)));
  }
}

TEST_CASE("cuda reductions match the cpu over dims, layouts and dtypes", "[tensors][cuda]") {
  if (no_cuda()) return;
  const std::vector<shape_t> dim_sets = {{}, {0}, {1}, {-1}, {0, 2}};
  for (dtype t : all_numeric)
    for (const auto& [la, a] : layouts(sample({6, 5, 40}, t, 9))) {
      const tensor ag = a.to(gpu);
      for (const shape_t& dims : dim_sets) {
        const std::string what = std::string(to_string(t)) + " " + la + " dims " + shape_to_string(dims);
        require_match(sum(ag, dims), sum(a, dims), "sum " + what);
        require_match(amax(ag, dims, true), amax(a, dims, true), "amax " + what);
        require_match(amin(ag, dims), amin(a, dims), "amin " + what);
        if (is_floating(t)) {
          require_match(mean(ag, dims), mean(a, dims), "mean " + what);
          require_match(var(ag, dims), var(a, dims), "var " + what);
        }
      }
      for (std::int64_t d : {0, 1, 2}) {
        require_match(argmax(ag, d), argmax(a, d), "argmax " + std::to_string(d));
        require_match(argmin(ag, d, true), argmin(a, d, true), "argmin " + std::to_string(d));
      }
      require_match(argmax(ag), argmax(a), "argmax flat");
    }
  const tensor big = sample({1 << 20}, dtype::float32, 10, 0.0, 1.0);
  // 2^20 elements into few outputs: the two-stage (partials, then finish) path.
  const tensor big_gpu = big.to(gpu);
  require_match(sum(big_gpu), sum(big), "sum of 2^20 elements");
  require_match(mean(big_gpu), mean(big), "mean of 2^20 elements");
  require_match(amax(big_gpu), amax(big), "amax of 2^20 elements");
  require_match(amin(big_gpu.view({4, 1 << 18}), {1}), amin(big.view({4, 1 << 18}), {1}), "amin of 4 long rows");
  require_match(sum(big_gpu.view({1 << 10, 1 << 10}).t(), {1}), sum(big.view({1 << 10, 1 << 10}).t(), {1}),
                "sum along a strided dim");
  const tensor empty_rows = sample({0, 4}, dtype::float32, 11);
  require_match(sum(empty_rows.to(gpu), {0}), sum(empty_rows, {0}), "sum over an empty dim");
}

TEST_CASE("cuda matmul matches the cpu for shapes, transposes, batches and float dtypes", "[tensors][cuda]") {
  if (no_cuda()) return;
  for (dtype t : floats) {
    const double scale = 0.5;
    const tensor a = sample({33, 17}, t, 12, -scale, scale), b = sample({17, 9}, t, 13, -scale, scale);
    const tensor ag = a.to(gpu), bg = b.to(gpu);
    const std::string ts(to_string(t));
    // cuBLAS accumulates 16-bit products in float in a different order: compare in float32.
    auto match = [&](const tensor& got, const tensor& want, const std::string& what) {
      if (t == dtype::float16 || t == dtype::bfloat16) {
        INFO(what);
        CHECK(allclose(got.cpu().to(dtype::float32), want.to(dtype::float32), 2e-2, 2e-2));
      } else {
        require_match(got, want, what);
      }
    };
    match(matmul(ag, bg), matmul(a, b), "matmul " + ts);
    match(matmul(bg.t(), ag.t()), matmul(b.t(), a.t()), "matmul of transposes " + ts);
    match(matmul(ag.slice(0, 0, 33, 2), bg), matmul(a.slice(0, 0, 33, 2), b), "matmul of a row-strided view " + ts);
    const tensor x = sample({4, 8, 6}, t, 14, -scale, scale), y = sample({6, 5}, t, 15, -scale, scale);
    match(matmul(x.to(gpu), y.to(gpu)), matmul(x, y), "broadcast batched matmul " + ts);
    const tensor z = sample({4, 6, 3}, t, 16, -scale, scale);
    match(bmm(x.to(gpu), z.to(gpu)), bmm(x, z), "bmm " + ts);
    const tensor c = sample({33, 9}, t, 17, -scale, scale);
    match(addmm(c.to(gpu), ag, bg, 0.5, 2.0), addmm(c, a, b, 0.5, 2.0), "addmm " + ts);
    match(matmul(sample({3, 0}, t, 18).to(gpu), sample({0, 4}, t, 19).to(gpu)), matmul(sample({3, 0}, t, 18), sample({0, 4}, t, 19)), "k = 0");
  }
}

TEST_CASE("cuda softmax and log_softmax match the cpu along every dim", "[tensors][cuda]") {
  if (no_cuda()) return;
  for (dtype t : floats)
    for (const auto& [la, a] : layouts(sample({5, 7, 300}, t, 20, -5.0, 5.0)))
      for (std::int64_t d : {0, 1, 2, -1}) {
        const std::string what = std::string(to_string(t)) + " " + la + " dim " + std::to_string(d);
        require_match(softmax(a.to(gpu), d), softmax(a, d), "softmax " + what);
        require_match(log_softmax(a.to(gpu), d), log_softmax(a, d), "log_softmax " + what);
      }
}

TEST_CASE("cuda indexing ops match the cpu", "[tensors][cuda]") {
  if (no_cuda()) return;
  const tensor idx = from_vector<std::int64_t>({3, 0, 3, 1});
  const tensor gidx = from_vector<std::int64_t>({0, 2, 1, 2, 2, 0, 1, 1}, {4, 2});
  for (dtype t : all_numeric) {
    const tensor a = sample({4, 3}, t, 21), src = sample({4, 2}, t, 22);
    const tensor ag = a.to(gpu);
    const std::string ts(to_string(t));
    require_match(index_select(ag, 0, idx.to(gpu)), index_select(a, 0, idx), "index_select dim 0 " + ts);
    require_match(index_select(ag.t(), 1, idx.to(gpu)), index_select(a.t(), 1, idx), "index_select transposed " + ts);
    require_match(gather(ag, 1, gidx.to(gpu)), gather(a, 1, gidx), "gather " + ts);
    require_match(scatter_add(ag, 1, gidx.to(gpu), src.to(gpu)), scatter_add(a, 1, gidx, src), "scatter_add " + ts);
    const tensor rows = sample({4, 3}, t, 23);
    require_match(index_add(ag, 0, idx.to(gpu), rows.to(gpu)), index_add(a, 0, idx, rows), "index_add " + ts);
  }
  const tensor e = sample({0, 3}, dtype::float32, 24);
  const tensor eidx = from_vector<std::int64_t>({2, 0});
  require_match(index_select(e.to(gpu), 1, eidx.to(gpu)), index_select(e, 1, eidx), "empty");
  // An index past the end is refused on the device as on the cpu, naming the index.
  const tensor a = sample({4, 3}, dtype::float32, 25);
  CHECK_THROWS_WITH(index_select(a, 1, idx), Catch::Contains("index_out_of_range") && Catch::Contains("index 3"));
  CHECK_THROWS_WITH(index_select(a.to(gpu), 1, idx.to(gpu)), Catch::Contains("index_out_of_range") && Catch::Contains("index 3"));
}

TEST_CASE("cuda random draws equal the cpu draws for the same seed", "[tensors][cuda]") {
  if (no_cuda()) return;
  for (dtype t : floats)
    for (const shape_t& s : {shape_t{1001}, shape_t{3, 7, 5}, shape_t{0}}) {
      generator gc(1234), gg(1234);
      const std::string what = std::string(to_string(t)) + " " + shape_to_string(s);
      INFO(what);
      CHECK(equal(rand(s, gg, tensor_options(t, gpu), -1.0, 3.0).cpu(), rand(s, gc, tensor_options(t), -1.0, 3.0)));
      CHECK(equal(rand(s, gg, tensor_options(t, gpu)).cpu(), rand(s, gc, tensor_options(t))));  // second draw
      CHECK(gg == gc);
      // Box-Muller uses log/sin/cos: CUDA and libm may differ in the last bit of a double.
      CHECK(allclose(randn(s, gg, tensor_options(t, gpu), 1.0, 2.0).cpu().to(dtype::float64),
                     randn(s, gc, tensor_options(t), 1.0, 2.0).to(dtype::float64), 1e-12, 1e-12));
    }
  for (dtype t : {dtype::int64, dtype::int32}) {
    generator gc(7), gg(7);
    CHECK(equal(randint(-50, 1000, {4097}, gg, tensor_options(t, gpu)).cpu(), randint(-50, 1000, {4097}, gc, tensor_options(t))));
  }
  // A non-contiguous destination is filled in its row-major element order, like on the cpu.
  generator gc(5), gg(5);
  tensor hc = zeros({6, 4}), hg = zeros({6, 4}, tensor_options(dtype::float32, gpu));
  tensor vc = hc.t(), vg = hg.t();
  uniform_(vc, gc);
  uniform_(vg, gg);
  CHECK(equal(hg.cpu(), hc));
}

TEST_CASE("cuda host-device copies round trip bit-exactly for every dtype and size", "[tensors][cuda]") {
  if (no_cuda()) return;
  const std::vector<dtype> every = {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16,
                                    dtype::int32,   dtype::int64,   dtype::uint8,   dtype::boolean};
  // 3M float64 = 24 MB: more than one 8 MiB pinned staging chunk in each direction.
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, std::int64_t{3} << 20})
    for (dtype t : every) {
      if (n > 1000 && t != dtype::float64 && t != dtype::uint8) continue;
      const tensor h = sample({n}, t, 25);
      const tensor back = h.to(gpu).cpu();
      INFO(std::string(to_string(t)) << " n=" << n);
      REQUIRE(back.dtype() == t);
      REQUIRE(back.numel() == n);
      CHECK(std::memcmp(back.data_ptr(), h.data_ptr(), h.nbytes()) == 0);
    }
  // Non-contiguous sources are made contiguous first; dtype conversion on the device.
  const tensor h = sample({64, 48}, dtype::float32, 26);
  CHECK(equal(h.t().to(gpu).cpu(), h.t()));
  require_match(h.to(gpu).to(dtype::float16), h.to(dtype::float16), "convert on device");
  require_match(h.to(gpu).t().contiguous(), h.t().contiguous(), "strided copy on device");
  tensor dst = zeros({48, 64}, tensor_options(dtype::float64, gpu));
  dst.copy_(h.t());
  require_match(dst, h.t().to(dtype::float64), "copy_ from cpu with conversion");
  tensor filled = full({5, 3}, 2.5, tensor_options(dtype::bfloat16, gpu));
  require_match(filled, full({5, 3}, 2.5, tensor_options(dtype::bfloat16)), "full");
  require_match(filled.t().fill_(-1.0).t(), full({5, 3}, -1.0, tensor_options(dtype::bfloat16)), "strided fill_");
}

#if defined(TROUPE_WITH_CUDA)

TEST_CASE("a stream guard makes a stream current and restores the previous one", "[tensors][cuda]") {
  if (no_cuda()) return;
  cuda::stream s1(0), s2(0);
  REQUIRE(cuda::current_stream(0) == nullptr);
  {
    cuda::stream_guard g1(s1);
    CHECK(cuda::current_stream(0) == s1.handle());
    {
      cuda::stream_guard g2(s2);
      CHECK(cuda::current_stream(0) == s2.handle());
    }
    CHECK(cuda::current_stream(0) == s1.handle());
  }
  CHECK(cuda::current_stream(0) == nullptr);
  cuda::stream moved(std::move(s1));
  CHECK(s1.handle() == nullptr);  // NOLINT: checking the moved-from state on purpose
  CHECK(moved.handle() != nullptr);
}

TEST_CASE("an event orders work on one stream after work on another", "[tensors][cuda]") {
  if (no_cuda()) return;
  cuda::stream producer(0), consumer(0);
  const tensor h = sample({1 << 22}, dtype::float32, 27);
  tensor x, y;
  cuda::event produced(0);
  {
    cuda::stream_guard g(producer);
    x = mul(h.to(gpu), 3.0);  // a long-ish kernel chain on the producer stream
    x = add(x, 1.0);
    produced.record();
  }
  {
    cuda::stream_guard g(consumer);
    produced.wait(consumer.handle());
    y = sub(x, 1.0);
    cuda::event done(0);
    done.record();
    done.synchronize();
    CHECK(done.query());
  }
  CHECK(allclose(y.cpu(), mul(h, 3.0), 1e-5, 1e-5));
  cuda::event start(0), stop(0);
  start.record(nullptr);
  stop.record(nullptr);
  stop.synchronize();
  CHECK(start.elapsed_ms(stop) >= 0.0f);
}

TEST_CASE("the caching allocator reuses blocks instead of calling cudaMalloc every step", "[tensors][cuda]") {
  if (no_cuda()) return;
  { tensor warm = empty({1000, 257}, tensor_options(dtype::float32, gpu)); }
  const auto before = cuda::caching_allocator_stats(0);
  for (int i = 0; i < 100; ++i) {
    tensor a = empty({1000, 257}, tensor_options(dtype::float32, gpu));
    tensor b = add(a.fill_(1.0), 1.0);
    (void)b;
  }
  const auto after = cuda::caching_allocator_stats(0);
  CHECK(after.cuda_malloc_calls - before.cuda_malloc_calls <= 1);  // b's block, once
  CHECK(after.allocations - before.allocations >= 200);
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.cached_bytes >= before.cached_bytes);
  cuda::empty_cache(0);
  CHECK(cuda::caching_allocator_stats(0).cached_bytes == 0);
}

TEST_CASE("a cuda device that does not exist is a device_mismatch naming it", "[tensors][cuda]") {
  if (no_cuda()) return;
  const int n = cuda::device_count();
  try {
    (void)default_allocator(cuda_device(n));
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::device_mismatch);
    CHECK_THAT(e.message(), Catch::Contains("cuda:" + std::to_string(n)));
  }
}

#endif  // TROUPE_WITH_CUDA

TEST_CASE("cuda device_count is zero or positive and never throws", "[tensors][cuda]") {
  const int n = cuda::device_count();
  CHECK(n >= 0);
  CHECK(cuda::is_available() == (n > 0));
}

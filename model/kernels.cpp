// Matrix-vector products for decoding on an x86 CPU with AVX2 (see model/kernels.py).
//
// A decode step multiplies a few rows (one token per sequence) by every weight matrix, so its
// speed is how fast the weights stream from memory. Each output channel is one dot product of a
// contiguous weight row with each input row, and several input rows share one pass over the
// weight row (struct Pass). Every input row is summed in the same order whatever the number of rows, so a
// sequence gets bit-identical results alone or in a batch.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

namespace {

// How a pass over one weight row is laid out, by weight type: how many input rows share it, and
// how many accumulators each row has. fp32 streams from memory, so more rows per pass pay (a
// batch of 8 in one pass, 15% faster than two of 4). int8 spends its time converting weights
// to float, so one row needs two independent sums to keep the FMA units busy (one is 2x slower).
template <typename Weight> struct Pass;
template <> struct Pass<float> { static constexpr int rows = 8, accumulators = 1; };
template <> struct Pass<int8_t> { static constexpr int rows = 4, accumulators = 2; };

// Weight rows ahead to prefetch: the hardware prefetcher alone leaves gaps once a pass does
// more than stream (measured 20-30% slower for a batch of 8).
constexpr int kPrefetchRows = 4;

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Eight weights as eight floats.
inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const int8_t* w) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
}

// sums[k] = dot(w, x[k]) for the N rows of x (each `in` long), then the tail past the last
// full step. A row's additions are the same whatever N is.
template <int N, typename Weight>
inline void dot_rows(const Weight* w, const float* x, int64_t in, float* sums) {
  constexpr int A = Pass<Weight>::accumulators;
  __m256 acc[N][A];
  for (int k = 0; k < N; k++)
    for (int a = 0; a < A; a++) acc[k][a] = _mm256_setzero_ps();
  const char* ahead = reinterpret_cast<const char*>(w + kPrefetchRows * in);
  int64_t i = 0;
  for (; i + 8 * A <= in; i += 8 * A) {
    if ((i * sizeof(Weight)) % 64 == 0) _mm_prefetch(ahead + i * sizeof(Weight), _MM_HINT_T0);  // once per line
    __m256 wv[A];
    for (int a = 0; a < A; a++) wv[a] = load8(w + i + 8 * a);
    for (int k = 0; k < N; k++)
      for (int a = 0; a < A; a++)
        acc[k][a] = _mm256_fmadd_ps(wv[a], _mm256_loadu_ps(x + k * in + i + 8 * a), acc[k][a]);
  }
  for (int k = 0; k < N; k++) {
    __m256 total = acc[k][0];
    for (int a = 1; a < A; a++) total = _mm256_add_ps(total, acc[k][a]);
    float s = horizontal_sum(total);
    for (int64_t j = i; j < in; j++) s += static_cast<float>(w[j]) * x[k * in + j];
    sums[k] = s;
  }
}

// dot_rows for n rows, 1 <= n <= N, with n known at compile time.
template <int N, typename Weight>
inline void dot_rows_upto(int64_t n, const Weight* w, const float* x, int64_t in, float* sums) {
  if constexpr (N > 1) {
    if (n < N) return dot_rows_upto<N - 1>(n, w, x, in, sums);
  }
  dot_rows<N>(w, x, in, sums);
}

// y[r, o] = dot(x[r], w[o]) * scale[o] + bias[o]; scale and bias may be null.
template <typename Weight>
torch::Tensor rows_times_weight(const torch::Tensor& x, const Weight* w, int64_t out_features,
                                const float* scale, const float* bias) {
  constexpr int R = Pass<Weight>::rows;
  const int64_t rows = x.size(0), in = x.size(1);
  torch::Tensor y = torch::empty({rows, out_features}, x.options());
  const float* xs = x.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  at::parallel_for(0, out_features, 64, [&](int64_t begin, int64_t end) {
    float sums[R];
    for (int64_t o = begin; o < end; o++) {
      for (int64_t r = 0; r < rows; r += R) {
        const int64_t n = std::min<int64_t>(R, rows - r);
        dot_rows_upto<R>(n, w + o * in, xs + r * in, in, sums);
        for (int64_t k = 0; k < n; k++) {
          const float v = scale ? sums[k] * scale[o] : sums[k];
          ys[(r + k) * out_features + o] = bias ? v + bias[o] : v;
        }
      }
    }
  });
  return y;
}

bool is_cpu_float(const torch::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == torch::kFloat; }

// x @ weight.T (* scale) + bias over x's last dimension, or None where the kernels cannot take
// the call: another device, dtype or memory order, or mismatched shapes (left to PyTorch, which
// names them). kernels.py has already decided the call is theirs to take (few rows, no autograd).
// Checked here rather than in Python: a decode step makes about fifty of these calls.
c10::optional<torch::Tensor> linear(const torch::Tensor& x, const torch::Tensor& weight,
                                    const c10::optional<torch::Tensor>& bias,
                                    const c10::optional<torch::Tensor>& scale) {
  if (x.dim() < 1 || weight.dim() != 2 || !is_cpu_float(x) || !weight.device().is_cpu() || !weight.is_contiguous())
    return c10::nullopt;
  const int64_t out_features = weight.size(0), in = weight.size(1);
  if (in == 0 || x.size(-1) != in || x.numel() == 0) return c10::nullopt;
  if (weight.scalar_type() != (scale ? torch::kChar : torch::kFloat)) return c10::nullopt;
  for (const auto* extra : {&bias, &scale})
    if (extra->has_value() && (!is_cpu_float(**extra) || (*extra)->dim() != 1 || (*extra)->size(0) != out_features
                               || !(*extra)->is_contiguous()))
      return c10::nullopt;
  const torch::Tensor rows = x.reshape({-1, in}).contiguous();
  const float* bias_data = bias ? bias->data_ptr<float>() : nullptr;
  torch::Tensor y = scale ? rows_times_weight<int8_t>(rows, weight.data_ptr<int8_t>(), out_features,
                                                      scale->data_ptr<float>(), bias_data)
                          : rows_times_weight<float>(rows, weight.data_ptr<float>(), out_features, nullptr, bias_data);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out_features;
  return y.view(shape);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Without the GIL: the scheduler decodes on its own thread while the app's threads serve.
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>());
}

// Decode kernels for an x86 CPU with AVX2 or AVX-512 (see engine/kernels.py): matrix-vector products, and
// attention for one new token per sequence.
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
#include <cmath>
#include <limits>
#include <vector>

namespace {

// How the products are blocked, by weight type and vector width.
// - `rows`: a call with up to this many rows (a small decode batch) takes one weight row at a
//   time and runs all its rows over it. Memory sets the speed there, and one stream of weights
//   reads fastest.
// - `block_weights` x `block_rows`: a call with more rows (a decode batch of 5-8, a prompt)
//   takes blocks of that many weight rows and input rows. Arithmetic sets the speed there, so
//   each weight vector loaded serves several input rows and each input vector several weight
//   rows; the block's sums fill most of the vector registers (16 with AVX2, 32 with AVX-512).
//   The shapes are the fastest of those tried on each width.
// - `accumulators` per sum: int8 spends its time converting weights to float, so one sum needs
//   two independent accumulators to keep the FMA units busy.
template <typename Weight> struct Pass;
#ifdef __AVX512F__
template <> struct Pass<float> {
  static constexpr int rows = 4, block_weights = 4, block_rows = 6, accumulators = 1;
};
template <> struct Pass<int8_t> {
  static constexpr int rows = 4, block_weights = 2, block_rows = 6, accumulators = 2;
};
#else
template <> struct Pass<float> {
  static constexpr int rows = 4, block_weights = 3, block_rows = 4, accumulators = 1;
};
template <> struct Pass<int8_t> {
  static constexpr int rows = 4, block_weights = 2, block_rows = 3, accumulators = 2;
};
#endif

// How far ahead of the weight rows in use to prefetch: the hardware prefetcher alone leaves gaps
// once a pass does more than stream. At least kPrefetchRows rows, and at least kPrefetchBytes, so
// that short rows (the bundled model's 1 KB) are asked for as early as long ones.
constexpr int kPrefetchRows = 4;
constexpr int64_t kPrefetchBytes = 12 * 1024;

template <typename Weight>
inline int64_t prefetch_rows(int64_t in) {
  return std::max<int64_t>(kPrefetchRows, kPrefetchBytes / (in * static_cast<int64_t>(sizeof(Weight))));
}

// The vectors the products work in: AVX-512's 16 floats where the build targets it (kernels.py
// asks for that on a CPU that has it), AVX2's 8 otherwise. The attention keeps AVX2's 8: a head
// is 64 wide, and its time is not in the arithmetic.
#ifdef __AVX512F__
using Floats = __m512;
constexpr int kLanes = 16;
inline Floats zeros() { return _mm512_setzero_ps(); }
inline Floats fmadd(Floats a, Floats b, Floats c) { return _mm512_fmadd_ps(a, b, c); }
inline Floats add(Floats a, Floats b) { return _mm512_add_ps(a, b); }
inline Floats load_floats(const float* w) { return _mm512_loadu_ps(w); }
inline Floats load_floats(const int8_t* w) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
}
#else
using Floats = __m256;
constexpr int kLanes = 8;
inline Floats zeros() { return _mm256_setzero_ps(); }
inline Floats fmadd(Floats a, Floats b, Floats c) { return _mm256_fmadd_ps(a, b, c); }
inline Floats add(Floats a, Floats b) { return _mm256_add_ps(a, b); }
inline Floats load_floats(const float* w) { return _mm256_loadu_ps(w); }
inline Floats load_floats(const int8_t* w) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
}
#endif

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#ifdef __AVX512F__
inline float horizontal_sum(__m512 v) {
  return horizontal_sum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
#endif

// Where a block's sums go: y[r, o] = sum * scale[o] + bias[o]; scale and bias may be null.
struct Output {
  float* y;
  int64_t out_features;
  const float *scale, *bias;
  void put(int64_t r, int64_t o, float sum) const {
    const float v = scale ? sum * scale[o] : sum;
    y[r * out_features + o] = bias ? v + bias[o] : v;
  }
};

// y[r + k, o + j] for WR weight rows from w (output channels o...) and N input rows from x
// (rows r...), each `in` long: one dot product each, the tail past the last full step added
// last. Every dot product takes the same additions in the same order whatever WR and N are, so
// a row's result does not depend on the call's other rows.
template <int WR, int N, typename Weight>
inline void dot_block(const Weight* w, const float* x, int64_t in, int64_t o, int64_t r, const Output& out) {
  constexpr int A = Pass<Weight>::accumulators, step = kLanes * A;
  static_assert(64 % (step * sizeof(Weight)) == 0, "a step within one cache line");
  Floats acc[WR][N][A];
  for (int j = 0; j < WR; j++)
    for (int k = 0; k < N; k++)
      for (int a = 0; a < A; a++) acc[j][k][a] = zeros();
  const char* ahead = reinterpret_cast<const char*>(w + prefetch_rows<Weight>(in) * in);
  int64_t i = 0;
  for (; i + step <= in; i += step) {
    if ((i * sizeof(Weight)) % 64 == 0)  // once per line
      for (int j = 0; j < WR; j++) _mm_prefetch(ahead + (j * in + i) * sizeof(Weight), _MM_HINT_T0);
    Floats wv[WR][A];
    for (int j = 0; j < WR; j++)
      for (int a = 0; a < A; a++) wv[j][a] = load_floats(w + j * in + i + kLanes * a);
    for (int k = 0; k < N; k++)
      for (int a = 0; a < A; a++) {
        const Floats xv = load_floats(x + k * in + i + kLanes * a);
        for (int j = 0; j < WR; j++) acc[j][k][a] = fmadd(wv[j][a], xv, acc[j][k][a]);
      }
  }
  for (int j = 0; j < WR; j++)
    for (int k = 0; k < N; k++) {
      Floats total = acc[j][k][0];
      for (int a = 1; a < A; a++) total = add(total, acc[j][k][a]);
      float s = horizontal_sum(total);
      for (int64_t t = i; t < in; t++) s += static_cast<float>(w[j * in + t]) * x[k * in + t];
      out.put(r + k, o + j, s);
    }
}

// dot_block for wr <= WR weight rows and n <= N input rows, with both known at compile time.
template <int WR, int N, typename Weight>
inline void dot_block_upto(int64_t wr, int64_t n, const Weight* w, const float* x, int64_t in, int64_t o, int64_t r,
                           const Output& out) {
  if constexpr (WR > 1) {
    if (wr < WR) return dot_block_upto<WR - 1, N>(wr, n, w, x, in, o, r, out);
  }
  if constexpr (N > 1) {
    if (n < N) return dot_block_upto<WR, N - 1>(wr, n, w, x, in, o, r, out);
  }
  dot_block<WR, N>(w, x, in, o, r, out);
}

// Blocks of WR weight rows x N input rows over output channels [begin, end) and every row.
template <int WR, int N, typename Weight>
void blocks(const Weight* w, const float* x, int64_t rows, int64_t in, int64_t begin, int64_t end, const Output& out) {
  for (int64_t o = begin; o < end; o += WR)
    for (int64_t r = 0; r < rows; r += N)
      dot_block_upto<WR, N>(std::min<int64_t>(WR, end - o), std::min<int64_t>(N, rows - r), w + o * in, x + r * in,
                            in, o, r, out);
}

// y = x @ w.T * scale + bias over `rows` rows of x (rows, in), into out.
template <typename Weight>
void rows_times_weight(const float* x, int64_t rows, int64_t in, const Weight* w, int64_t out_features,
                       const Output& out) {
  using P = Pass<Weight>;
  at::parallel_for(0, out_features, 64, [&](int64_t begin, int64_t end) {
    if (rows <= P::rows)
      blocks<1, P::rows>(w, x, rows, in, begin, end, out);
    else
      blocks<P::block_weights, P::block_rows>(w, x, rows, in, begin, end, out);
  });
}

bool is_cpu_float(const torch::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == torch::kFloat; }

// Whether the products can take this weight (int8 with a scale, or fp32), bias and scale.
bool takes_weight(const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
                  const c10::optional<torch::Tensor>& scale) {
  if (weight.dim() != 2 || !weight.device().is_cpu() || !weight.is_contiguous() || weight.size(1) == 0
      || weight.scalar_type() != (scale ? torch::kChar : torch::kFloat))
    return false;
  for (const auto* extra : {&bias, &scale})
    if (extra->has_value() && (!is_cpu_float(**extra) || (*extra)->dim() != 1 || (*extra)->size(0) != weight.size(0)
                               || !(*extra)->is_contiguous()))
      return false;
  return true;
}

// x @ weight.T (* scale) + bias over x's last dimension, or None where the kernels cannot take
// the call: another device, dtype or memory order, or mismatched shapes (left to PyTorch, which
// names them). kernels.py has already decided the call is theirs to take (few rows, no autograd).
// Checked here rather than in Python: a decode step makes about fifty of these calls.
c10::optional<torch::Tensor> linear(const torch::Tensor& input, const torch::Tensor& weight,
                                    const c10::optional<torch::Tensor>& bias,
                                    const c10::optional<torch::Tensor>& scale) {
  if (input.dim() < 1 || !is_cpu_float(input) || !takes_weight(weight, bias, scale)) return c10::nullopt;
  if (input.size(-1) != weight.size(1) || input.numel() == 0) return c10::nullopt;
  const torch::Tensor x = input.reshape({-1, weight.size(1)}).contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  shape.back() = weight.size(0);
  torch::Tensor y = input.new_empty(shape);
  const Output out{y.data_ptr<float>(), weight.size(0), scale ? scale->data_ptr<float>() : nullptr,
                   bias ? bias->data_ptr<float>() : nullptr};
  if (scale)
    rows_times_weight(x.data_ptr<float>(), x.size(0), x.size(1), weight.data_ptr<int8_t>(), out.out_features, out);
  else
    rows_times_weight(x.data_ptr<float>(), x.size(0), x.size(1), weight.data_ptr<float>(), out.out_features, out);
  return y;
}

// exp(x) for x <= 0 (softmax after subtracting the maximum): exp(x) = 2^n exp(r) with
// n = round(x / ln 2) and |r| <= ln 2 / 2, exp(r) by its Taylor polynomial (Cephes' expf), to
// about 2 ulp down to x = -87; below that it gives exp(-87), 1.6e-38, next to the top score's 1.
// Vectorised: a scalar exponential per score would cost as much as the rest of the attention.
// NaN stays NaN.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);  // below, 2^n is no longer a normal float; NaN passes
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts, so r stays exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i two_to_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n));
}

// Slots rounded up to whole vectors of 8 scores: the length of attend's score buffer.
inline int64_t padded_slots(int64_t slots) { return (slots + 7) / 8 * 8; }

inline float dot(const float* a, const float* b, int64_t n) {  // n a multiple of 8
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  return horizontal_sum(acc);
}

// The horizontal sums of eight vectors at once: lane j of the result is horizontal_sum(v[j]), in
// the same additions in the same order (the lower half plus the upper, then lanes 0 + 2 and 1 + 3,
// then 0 + 1), so a score comes out in the same bits as from dot(), in 22 instructions where
// eight horizontal_sum calls take 56.
inline __m256 horizontal_sums(const __m256 (&v)[8]) {
  __m256 halves[4];  // halves[i]: (lanes 0-3 of v[2i] + lanes 4-7 of v[2i], the same of v[2i + 1])
  for (int i = 0; i < 4; i++)
    halves[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                              _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  __m256 pairs[2];  // pairs[i]: lanes (0 + 2, 1 + 3) of v[4i], v[4i + 2] | of v[4i + 1], v[4i + 3]
  for (int i = 0; i < 2; i++)
    pairs[i] = _mm256_add_ps(_mm256_shuffle_ps(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // (0 2 4 6 | 1 3 5 7) in order
}

// dot(q, k + j * slot_stride, dim) for the eight slots j = 0..7, in its bits (see horizontal_sums).
inline __m256 dots8(const float* q, const float* k, int64_t slot_stride, int64_t dim) {
  __m256 acc[8];
  for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < dim; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + j * slot_stride + i), acc[j]);
  }
  return horizontal_sums(acc);
}

// out[0, 8N) = norm * sum_s p[s] v[s][0, 8N) over the slots, one slot after another, skipping
// masked ones (p = 0): attend's weighted sum of the values, 8N of their dim entries at a time. The
// sums stay in registers through the slots, so no slot's multiply-adds wait for the previous
// slot's stores.
template <int N>
inline void weighted_sum(const float* p, const float* v, int64_t slot_stride, int64_t slots, __m256 norm, float* out) {
  __m256 sums[N];
  for (int j = 0; j < N; j++) sums[j] = _mm256_setzero_ps();
  for (int64_t s = 0; s < slots; s++) {
    if (p[s] == 0.0f) continue;  // masked
    const __m256 weight = _mm256_set1_ps(p[s]);
    for (int j = 0; j < N; j++) sums[j] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(v + s * slot_stride + 8 * j), sums[j]);
  }
  for (int j = 0; j < N; j++) _mm256_storeu_ps(out + 8 * j, _mm256_mul_ps(sums[j], norm));
}

// weighted_sum for n <= N vectors, with n known at compile time (as dot_block_upto).
template <int N>
inline void weighted_sum_upto(int64_t n, const float* p, const float* v, int64_t slot_stride, int64_t slots,
                              __m256 norm, float* out) {
  if constexpr (N > 1) {
    if (n < N) return weighted_sum_upto<N - 1>(n, p, v, slot_stride, slots, norm, out);
  }
  weighted_sum<N>(p, v, slot_stride, slots, norm, out);
}

// scores[s] = q.k[s] / sqrt(dim) for the slots `seen` marks (all when null), -inf for the others
// and up to padded_slots(slots): eight slots at a time (dots8), then one by one, in the same bits
// either way; eight at a time shares each query load and one tree of horizontal sums.
void score_slots(const float* q, const float* k, int64_t slot_stride, int64_t slots, int64_t dim, const bool* seen,
                 float* scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const float minus_inf = -std::numeric_limits<float>::infinity();
  int64_t s = 0;
  for (; s + 8 <= slots; s += 8) {
    _mm256_storeu_ps(scores + s, _mm256_mul_ps(dots8(q, k + s * slot_stride, slot_stride, dim), _mm256_set1_ps(scale)));
    if (seen)
      for (int j = 0; j < 8; j++)
        if (!seen[s + j]) scores[s + j] = minus_inf;
  }
  for (; s < padded_slots(slots); s++)
    scores[s] = s < slots && (!seen || seen[s]) ? dot(q, k + s * slot_stride, dim) * scale : minus_inf;
}

// Softmax attention of one query over the slots of one (row, head): out = sum_s p[s] v[s] / sum_s p[s],
// p[s] = exp(q.k[s] / sqrt(dim) - max) over the slots `seen` marks (all when null; the caller
// lets every query see at least its own slot). `scores` has room for padded_slots(slots).
// Slot s always falls in lane s % 8 and masked slots add exact zeros, so a row's result does not
// depend on how many slots other rows have, as long as its tokens keep their slot numbers (the
// scheduler's rows do: each prompt is prefilled alone from slot 0 and copied slot for slot). A NaN
// or infinite score makes the result NaN, as in PyTorch.
void attend(const float* q, const float* k, const float* v, int64_t slot_stride, int64_t slots, int64_t dim,
            const bool* seen, float* scores, float* out) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const int64_t padded = padded_slots(slots);
  score_slots(q, k, slot_stride, slots, dim, seen, scores);
  float top = minus_inf;
  for (int64_t s = 0; s < padded; s++) top = std::max(top, scores[s]);  // a NaN score is skipped here, and turns p NaN below
  __m256 total = _mm256_setzero_ps();
  for (int64_t s = 0; s < padded; s += 8) {
    const __m256 x = _mm256_loadu_ps(scores + s);
    const __m256 p = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(x, _mm256_set1_ps(top))),
                                   _mm256_cmp_ps(x, _mm256_set1_ps(minus_inf), _CMP_NEQ_UQ));  // masked: 0
    _mm256_storeu_ps(scores + s, p);
    total = _mm256_add_ps(total, p);
  }
  const __m256 norm = _mm256_set1_ps(1.0f / horizontal_sum(total));
  for (int64_t d = 0; d < dim; d += 64)  // dim a multiple of 8; up to 8 vectors of it at a time
    weighted_sum_upto<8>(std::min<int64_t>(dim - d, 64) / 8, scores, v + d, slot_stride, slots, norm, out + d);
}

// Whether decode_attention can take this mask for rows x slots (no mask: yes).
bool takes_mask(const c10::optional<torch::Tensor>& seen, int64_t rows, int64_t slots) {
  return !seen || (seen->scalar_type() == torch::kBool && seen->dim() == 2 && seen->size(0) == rows
                   && seen->size(1) == slots && seen->stride(1) == 1 && seen->device().is_cpu());
}

// Whether decode_attention can take q, keys, values and seen (below).
bool takes_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                     const c10::optional<torch::Tensor>& seen) {
  for (const auto* t : {&q, &keys, &values})
    if (t->dim() != 4 || !is_cpu_float(*t) || t->stride(3) != 1) return false;
  const int64_t rows = q.size(0), heads = q.size(1), slots = keys.size(2), dim = q.size(3);
  return q.size(2) == 1 && dim != 0 && dim % 8 == 0 && slots != 0 && keys.sizes() == values.sizes()
         && keys.strides() == values.strides() && keys.size(0) == rows && keys.size(1) == heads && keys.size(3) == dim
         && takes_mask(seen, rows, slots);
}

// Attention of one new token per row: q (rows, heads, 1, dim), keys and values (rows, heads,
// slots, dim) as views of the KV cache, `seen` an optional (rows, slots) mask (the query's own
// row of the causal-padding mask). Returns (rows, heads, 1, dim) as a view of (rows, 1, heads,
// dim), so the caller's merge of the heads is free. None where the kernel cannot take the call.
c10::optional<torch::Tensor> decode_attention(const torch::Tensor& q, const torch::Tensor& keys,
                                              const torch::Tensor& values, const c10::optional<torch::Tensor>& seen) {
  if (!takes_attention(q, keys, values, seen)) return c10::nullopt;
  const int64_t heads = q.size(1), slots = keys.size(2), dim = q.size(3);
  torch::Tensor y = torch::empty({q.size(0), 1, heads, dim}, q.options());
  const float *qs = q.data_ptr<float>(), *ks = keys.data_ptr<float>(), *vs = values.data_ptr<float>();
  const bool* seen_data = seen ? seen->data_ptr<bool>() : nullptr;
  float* outs = y.data_ptr<float>();
  const int64_t work = std::max<int64_t>(1, 16384 / (slots * dim));  // (row, head) pairs per thread at least
  at::parallel_for(0, q.size(0) * heads, work, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(padded_slots(slots));
    for (int64_t i = begin; i < end; i++) {
      const int64_t r = i / heads, h = i % heads;
      attend(qs + r * q.stride(0) + h * q.stride(1), ks + r * keys.stride(0) + h * keys.stride(1),
             vs + r * values.stride(0) + h * values.stride(1), keys.stride(2), slots, dim,
             seen_data ? seen_data + r * seen->stride(0) : nullptr, scores.data(), outs + (r * heads + h) * dim);
    }
  });
  return y.transpose(1, 2);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Without the GIL: the scheduler decodes on its own thread while the app's threads serve.
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>());
  m.def("decode_attention", &decode_attention, py::call_guard<py::gil_scoped_release>());
}

// Scalar helpers with torch's semantics, shared by the CPU and CUDA preludes (one definition, so both
// targets compute the same thing). Spliced into namespace bpk of cpu_runtime.h and cuda_runtime.cuh at
// their "@scalar_ops" line, after BPK_SCALAR (the function qualifiers) and vexp / verf are defined.

template <class T>
BPK_SCALAR T sigmoid(T x) {
  return T(1) / (T(1) + vexp(-x));
}
// tanh that vectorizes (libm's tanhf is a call per element): below |x| = 0.5 the odd Taylor series
// through x^13 (the next term is under 1e-7 of the value there), above it 1 - 2 / (exp(2|x|) + 1),
// then the sign; within 2 float ulp of tanh, +-1 at +-inf, NaN stays NaN. Doubles use libm.
BPK_SCALAR float vtanh(float x) {
  const float a = std::fabs(x), s = a * a;
  const float series =
      a + a * s *
              (-1.0f / 3 + s * (2.0f / 15 + s * (-17.0f / 315 + s * (62.0f / 2835 +
                                                                   s * (-1382.0f / 155925 + s * (21844.0f / 6081075))))));
  const float big = 1.0f - 2.0f / (vexp(2.0f * a) + 1.0f);
  return std::copysign(a < 0.5f ? series : big, x);
}
BPK_SCALAR double vtanh(double x) { return std::tanh(x); }
template <class T>
BPK_SCALAR T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + verf(x * T(0.7071067811865476)));
}
template <class T>
BPK_SCALAR T gelu_tanh(T x) {
  return T(0.5) * x * (T(1) + std::tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x)));
}
template <class T>
BPK_SCALAR T floordiv_i(T a, T b) {
  T q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
// Integer division truncating toward zero (C's, and ONNX's); x / 0 gives 0 and MIN / -1 wraps, so
// no input traps.
template <class T>
BPK_SCALAR T div_trunc(T a, T b) {
  if (b == 0) return T(0);
  if (std::is_signed<T>::value && b == T(-1)) {
    using U = typename std::make_unsigned<T>::type;
    return T(U(0) - U(a));
  }
  return T(a / b);
}
// C's integer remainder (sign of the dividend, like fmod); x % 0 gives 0 and MIN % -1 gives 0.
template <class T>
BPK_SCALAR T fmod_i(T a, T b) {
  if (b == 0 || (std::is_signed<T>::value && b == T(-1))) return T(0);
  return T(a % b);
}
// torch.remainder (Python's %): the remainder takes the divisor's sign, from the exact fmod (as torch's
// kernels compute it); integer x % 0 gives 0, as fmod_i.
template <class T>
BPK_SCALAR T remainder_f(T a, T b) {
  T r = std::fmod(a, b);
  return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? T(r + b) : r;
}
template <class T>
BPK_SCALAR T remainder_i(T a, T b) {
  T r = fmod_i(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
}
template <class T>
BPK_SCALAR T mod_py(T a, T b) {
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <class T>
BPK_SCALAR T ipow(T base, T exp) {
  if (exp < 0) return base == 1 ? T(1) : (base == -1 ? ((exp % 2) ? T(-1) : T(1)) : T(0));
  T out = 1;
  while (exp) {
    if (exp & 1) out = T(out * base);
    base = T(base * base);
    exp >>= 1;
  }
  return out;
}
// Note [NaN-propagating max]: max / min that propagate NaN like torch, written without short-circuit
// control flow so loops vectorize. `b > a ? b : a` is already a when a is NaN (the comparison is false)
// and a on a tie (torch's clamp keeps -0.0 against a bound of 0), so only b's NaN needs a test; with a
// constant b (clamp, ReLU6, hardswish, hardsigmoid) that test folds away and a clamp is two compares and
// two blends per vector. Testing a's NaN as well (the older form) compiled a vectorized clamp into ~25
// mask instructions per AVX-512 vector: a depthwise convolution with a hardswish epilogue ran 2x slower.
template <class T>
BPK_SCALAR T fmax_nan(T a, T b) {
  const T m = b > a ? b : a;
  return b != b ? b : m;
}
template <class T>
BPK_SCALAR T fmin_nan(T a, T b) {
  const T m = b < a ? b : a;
  return b != b ? b : m;
}
// Note [Vector clamp]: clamp(x, lo, hi) for lo <= hi, bitwise fmin_nan(fmax_nan(x, lo), hi) (NaN stays
// NaN, -0.0 stays against a bound of 0), both tests on x. Written as the two nested helpers, GCC 12's
// vectorizer folds the second test through the first select into three compares, two blends and a
// mask op per vector; these two selects on x compile to two compares, one blend and one mask op (an
// AND where lo is 0). A ReLU6 epilogue cost a 16 -> 64-channel pointwise convolution 1.26x its time
// and a depthwise one 1.18x against ReLU's single select (x86-64-v3, Zen 4); with this helper the
// expansion ran 1.14-1.15x and the hardswish depthwise kernel 1.22-1.24x faster than before.
template <class T>
BPK_SCALAR T clamp_nan(T x, T lo, T hi) {
  const T r = x < lo ? lo : x;
  return x > hi ? hi : r;
}
// Note [Sort kernel]: element (u at position i) sorts before (w at position j) in torch's stable
// order: ascending with NaN last, or descending with NaN first; equal values keep input order.
template <class T>
BPK_SCALAR bool sort_before(T u, int64_t i, T w, int64_t j, bool descending) {
  const bool un = u != u, wn = w != w;
  if (un != wn) return descending ? un : wn;
  if (!un && u != w) return descending ? u > w : u < w;
  return i < j;
}

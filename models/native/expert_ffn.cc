// Dropless routed SwiGLU experts for few tokens on CPU (a decode step, a short prefill), as an XLA FFI custom call.
//
// y[n, j, :] = (silu(x[n] @ w_gate[e]) * (x[n] @ w_up[e])) @ w_down[e] with e = experts[n, j]; y[n, j, :] = 0 where
// experts[n, j] is outside [0, E) (padding / masked assignments). float32 in, float32 out, float32 accumulation.
//
// Why it exists: at a decode step every expert gets a handful of rows, and the layer is bound by streaming the
// experts' weights (W1: 12 MiB per layer, 48 MiB for four, more than a small VM's usable cache). XLA's CPU batched
// matmul at these shapes read the weights at roughly half the rate PyTorch's kernels did on the same machine
// (BENCHMARKS.md). Here each expert's weights are streamed once, in column panels, and every row routed to that
// expert is multiplied against a panel while it is in cache. Experts are spread over XLA's intra-op thread pool.
//
// Built by models/native_moe.py with the host compiler (-O3 -march=native); GCC vector extensions keep it portable
// (512-bit vectors lower to AVX-512 where the CPU has it, to pairs of AVX2 registers otherwise).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v16 __attribute__((vector_size(64), aligned(4)));  // unaligned loads and stores are allowed
constexpr int kLanes = 16;
constexpr int kRows = 6;  // rows per register tile: kRows x kCols vectors of accumulators
constexpr int kCols = 4;  // vectors (of 16 floats) per register tile's row
// Software prefetch this many rows of w ahead. A panel's rows are n floats apart (2 KiB for W1's gate), too far
// for the hardware prefetchers to follow within a page; prefetching cut W1's decode layer from 0.71-0.83 to
// 0.59-0.65 ms on 2 threads (1.96 to 1.35 ms on one).
constexpr int kPrefetchRows = 16;

// out_rows[r][0:n] = sum_k in_rows[r][k] * w[k, 0:n] for r < m; w is [K, n] row-major with leading dimension n.
// Column panels of kCols vectors outermost, so a [K, 64] panel of w is read from memory once and then served from
// cache to every row tile.
template <int R, int C>
inline void tile(const float* const* in_rows, const float* w, int K, int n, int c0, float* const* out_rows) {
  v16 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = (v16){};
  for (int k = 0; k < K; ++k) {
    const float* wk = w + static_cast<int64_t>(k) * n + c0;
    for (int c = 0; c < C; ++c) __builtin_prefetch(wk + kPrefetchRows * n + c * kLanes);
    v16 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = *reinterpret_cast<const v16*>(wk + c * kLanes);
    for (int r = 0; r < R; ++r) {
      const float xv = in_rows[r][k];
      for (int c = 0; c < C; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) *reinterpret_cast<v16*>(out_rows[r] + c0 + c * kLanes) = acc[r][c];
}

template <int C>
inline void row_tiles(const float* const* in_rows, const float* w, int m, int K, int n, int c0,
                      float* const* out_rows) {
  int r = 0;
  for (; r + kRows <= m; r += kRows) tile<kRows, C>(in_rows + r, w, K, n, c0, out_rows + r);
  switch (m - r) {
    case 1: tile<1, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    case 2: tile<2, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    case 3: tile<3, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    case 4: tile<4, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    case 5: tile<5, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    default: break;
  }
}

void matmul_rows(const float* const* in_rows, const float* w, int m, int K, int n, float* const* out_rows) {
  int c0 = 0;
  for (; c0 + kCols * kLanes <= n; c0 += kCols * kLanes) row_tiles<kCols>(in_rows, w, m, K, n, c0, out_rows);
  for (; c0 + kLanes <= n; c0 += kLanes) row_tiles<1>(in_rows, w, m, K, n, c0, out_rows);
  for (; c0 < n; ++c0) {  // columns past the last full vector (widths not a multiple of 16)
    for (int r = 0; r < m; ++r) {
      float s = 0.f;
      for (int k = 0; k < K; ++k) s += in_rows[r][k] * w[static_cast<int64_t>(k) * n + c0];
      out_rows[r][c0] = s;
    }
  }
}

// One expert: its m rows through gate / up, silu(gate) * up, then down, written to their output rows.
void one_expert(const float* const* x_rows, float* const* y_rows, int m, const float* wg, const float* wu,
                const float* wd, int D, int F) {
  std::vector<float> gate(static_cast<size_t>(m) * F), up(static_cast<size_t>(m) * F);
  std::vector<float*> g_rows(m), u_rows(m);
  for (int r = 0; r < m; ++r) {
    g_rows[r] = gate.data() + static_cast<size_t>(r) * F;
    u_rows[r] = up.data() + static_cast<size_t>(r) * F;
  }
  matmul_rows(x_rows, wg, m, D, F, g_rows.data());
  matmul_rows(x_rows, wu, m, D, F, u_rows.data());
  for (size_t i = 0; i < gate.size(); ++i) {
    const float g = gate[i];
    gate[i] = g / (1.f + std::exp(-g)) * up[i];
  }
  std::vector<const float*> h_rows(g_rows.begin(), g_rows.end());
  matmul_rows(h_rows.data(), wd, m, F, D, y_rows);
}

// What the caller and the pool's tasks share; owned jointly so a task that starts after the call returned (its
// work already taken) touches nothing freed.
struct Work {
  std::vector<std::vector<const float*>> x_rows;
  std::vector<std::vector<float*>> y_rows;
  const float *wg, *wu, *wd;
  int D, F;
  std::vector<int> order;  // experts with rows, largest first
  std::atomic<int> next{0};
  std::atomic<int> done{0};

  void run() {
    for (int i = next.fetch_add(1); i < static_cast<int>(order.size()); i = next.fetch_add(1)) {
      const int e = order[i];
      const int64_t g = static_cast<int64_t>(D) * F;
      one_expert(x_rows[e].data(), y_rows[e].data(), static_cast<int>(x_rows[e].size()), wg + e * g, wu + e * g,
                 wd + e * g, D, F);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error ExpertFfnImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> experts,
                         ffi::Buffer<ffi::F32> w_gate, ffi::Buffer<ffi::F32> w_up, ffi::Buffer<ffi::F32> w_down,
                         ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), ed = experts.dimensions(), gd = w_gate.dimensions(), ud = w_up.dimensions(),
             dd = w_down.dimensions();
  if (xd.size() != 2 || ed.size() != 2 || gd.size() != 3 || ud.size() != 3 || dd.size() != 3 || ed[0] != xd[0] ||
      gd[1] != xd[1] || ud[0] != gd[0] || ud[1] != gd[1] || ud[2] != gd[2] || dd[0] != gd[0] || dd[1] != gd[2] ||
      dd[2] != gd[1])
    return ffi::Error::InvalidArgument("expert_ffn: expected x [N, D], experts [N, k], w_gate / w_up [E, D, F], "
                                       "w_down [E, F, D]");
  const int64_t N = xd[0], D = xd[1], K = ed[1], E = gd[0], F = gd[2];
  const float* xp = x.typed_data();
  const int32_t* ep = experts.typed_data();
  float* yp = y->typed_data();

  auto work = std::make_shared<Work>();
  work->x_rows.resize(E);
  work->y_rows.resize(E);
  work->wg = w_gate.typed_data();
  work->wu = w_up.typed_data();
  work->wd = w_down.typed_data();
  work->D = static_cast<int>(D);
  work->F = static_cast<int>(F);
  for (int64_t a = 0; a < N * K; ++a) {
    const int32_t e = ep[a];
    float* out = yp + a * D;
    if (e < 0 || e >= E) {
      std::memset(out, 0, sizeof(float) * D);
      continue;
    }
    work->x_rows[e].push_back(xp + (a / K) * D);
    work->y_rows[e].push_back(out);
  }
  for (int e = 0; e < E; ++e)
    if (!work->x_rows[e].empty()) work->order.push_back(e);
  std::stable_sort(work->order.begin(), work->order.end(),
                   [&](int a, int b) { return work->x_rows[a].size() > work->x_rows[b].size(); });
  const int items = static_cast<int>(work->order.size());
  const int helpers = static_cast<int>(std::min<int64_t>(pool.num_threads(), items) - 1);
  for (int t = 0; t < helpers; ++t) pool.Schedule([work] { work->run(); });
  work->run();
  // Every item has been taken; wait for the ones a helper is still computing (never for a helper to start).
  while (work->done.load(std::memory_order_acquire) < items) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ExpertFfn, ExpertFfnImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [N, D]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // experts [N, k], outside [0, E): no row
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_gate [E, D, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_up [E, D, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_down [E, F, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [N, k, D]
);

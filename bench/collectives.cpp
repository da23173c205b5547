// hspmd-collectives: an nccl-tests style sweep of hspmd's collectives, with the same operation
// called directly through MPI (or NCCL) in the same run, so the library's overhead is visible side
// by side.
//
//   mpirun -np 3 build/release/bench/hspmd-collectives -b 1K -e 64M -f 4 -c 1 --algo all --ratios
//   4:2:1
//   mpirun -np 8 hspmd-collectives --backend nccl ...   # one GPU per rank, device = local rank
//
// With --backend nccl the buffers are device memory (cudaMalloc), the checks copy them back, and
// the direct baseline is ncclAllReduce / ncclBroadcast (NCCL has no uneven collectives: the other
// rows have none). This build path compiles wherever CUDA and NCCL are found; where this project
// is built no GPU runs it.
//
// Sizes follow nccl-tests: the buffer for all_reduce and broadcast, the gathered output for
// all_gather_v, the reduced input for reduce_scatter_v, the bytes each rank sends for
// all_to_all_v. Times are per call: each iteration is timed on every rank, the slowest rank's
// time counts, and median/min/max are over iterations. algbw = size / median time; busbw
// scales it as nccl-tests does: all_reduce 2(n-1)/n, all_gather_v, reduce_scatter_v and
// all_to_all_v (n-1)/n, broadcast 1.

#include <hspmd/hspmd.hpp>
#include <hspmd/io/cli.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

// Where a sweep's buffers live. Host memory (MPI) is filled and read in place.
template <class T>
void upload(std::vector<T>& b, const std::vector<T>& h) {
  std::copy(h.begin(), h.end(), b.begin());
}
template <class T>
std::vector<T> download(const std::vector<T>& b) {
  return b;
}

#if defined(HSPMD_HAS_NCCL)
// Device memory of the current CUDA device, allocated once at its capacity; `assign` resizes
// within it and zeroes.
template <class T>
class device_array {
public:
  device_array(std::size_t capacity, int rank) : cap_(capacity), rank_(rank) {
    HSPMD_CUDA_CHECK(cudaMalloc(&p_, std::max<std::size_t>(capacity, 1) * sizeof(T)), rank_);
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { cudaFree(p_); }
  void assign(std::size_t n, T /*zero*/) {
    if (n > cap_)
      throw hspmd::comm_error(rank_, "hspmd-collectives", "buffer of " + std::to_string(cap_) +
                                                              " elements asked for " +
                                                              std::to_string(n));
    n_ = n;
    if (n != 0)
      HSPMD_CUDA_CHECK(cudaMemset(p_, 0, n * sizeof(T)), rank_);
  }
  [[nodiscard]] T* data() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  friend void upload(device_array& b, const std::vector<T>& h) {
    if (!h.empty())
      HSPMD_CUDA_CHECK(cudaMemcpy(b.p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
                       b.rank_);
  }
  friend std::vector<T> download(const device_array& b) {
    std::vector<T> h(b.n_);
    if (b.n_ != 0)
      HSPMD_CUDA_CHECK(cudaMemcpy(h.data(), b.p_, b.n_ * sizeof(T), cudaMemcpyDeviceToHost),
                       b.rank_);
    return h;
  }

private:
  T* p_ = nullptr;
  std::size_t cap_ = 0;
  std::size_t n_ = 0;
  int rank_ = 0;
};

#endif

struct options {
  std::string min_bytes = "32";
  std::string max_bytes = "32M";
  double factor = 2.0;
  int iterations = 20;
  int warmup = 5;
  int check = 1;
  std::string op = "all";
  std::string algo = "automatic";
  std::string ratios;
  std::string backend = "mpi";
  std::string dtype = "f32";
  std::string json_file;
  std::string cluster_file;
  bool calibrate = false;
};

// "64M" -> 67108864 (K, M, G are powers of 1024, as in nccl-tests).
// nccl-tests' spellings ("allreduce", "-d float") for ours ("all_reduce", "f32").
std::string nccl_tests_spelling(const std::string& s) {
  static const std::pair<const char*, const char*> aliases[] = {
      {"allreduce", "all_reduce"},
      {"allgather", "all_gather_v"},
      {"all_gather", "all_gather_v"},
      {"reducescatter", "reduce_scatter_v"},
      {"reduce_scatter", "reduce_scatter_v"},
      {"alltoall", "all_to_all_v"},
      {"all_to_all", "all_to_all_v"},
      {"bcast", "broadcast"},
      {"float", "f32"},
      {"float32", "f32"},
      {"double", "f64"},
      {"float64", "f64"},
      {"int", "i32"},
      {"int32", "i32"}};
  for (const auto& [from, to] : aliases)
    if (s == from)
      return to;
  return s;
}

std::size_t parse_bytes(const std::string& s, const char* flag) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    throw hspmd::config_error(std::string("flag ") + flag, "\"" + s + "\" is not a size",
                              "a number with an optional K, M or G suffix, e.g. 64M");
  }
  double unit = 1;
  const std::string suffix = s.substr(pos);
  if (suffix == "K" || suffix == "k")
    unit = 1024.0;
  else if (suffix == "M" || suffix == "m")
    unit = 1024.0 * 1024.0;
  else if (suffix == "G" || suffix == "g")
    unit = 1024.0 * 1024.0 * 1024.0;
  else if (!suffix.empty())
    throw hspmd::config_error(std::string("flag ") + flag, "unknown suffix \"" + suffix + "\"",
                              "K, M or G");
  if (!(v >= 0) || !std::isfinite(v))
    throw hspmd::config_error(std::string("flag ") + flag, "\"" + s + "\" is negative",
                              "a size >= 0");
  return static_cast<std::size_t>(v * unit);
}

std::vector<double> parse_ratios(const std::string& s, int ranks) {
  std::vector<double> r;
  if (s.empty())
    return std::vector<double>(static_cast<std::size_t>(ranks), 1.0);
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ':')) {
    try {
      std::size_t pos = 0;
      r.push_back(std::stod(item, &pos));
      if (pos != item.size())
        throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw hspmd::config_error("flag --ratios " + s, "\"" + item + "\" is not a number",
                                "ratios like 4:2:1, one per rank");
    }
  }
  if (r.size() != static_cast<std::size_t>(ranks))
    throw hspmd::config_error("flag --ratios " + s,
                              std::to_string(r.size()) + " ratios for " + std::to_string(ranks) +
                                  " ranks",
                              "one ratio per rank, e.g. --ratios 2:1 for 2 ranks");
  (void)hspmd::shard_lengths(1, r); // validates: finite, >= 0, positive sum
  return r;
}

double busbw_factor(hspmd::collective op, double n) {
  switch (op) {
  case hspmd::collective::all_reduce:
    return 2.0 * (n - 1.0) / n;
  case hspmd::collective::broadcast:
    return 1.0;
  default:
    return (n - 1.0) / n;
  }
}

template <class T>
MPI_Datatype mpi_type() {
  return hspmd::mpi_datatype<T>();
}

// Deterministic, small integers: exactly representable, and sums over ranks are exact.
template <class T>
T value(std::size_t rank, std::size_t i) {
  return static_cast<T>(static_cast<int>((rank * 7919 + i * 31) % 17) - 8);
}

struct stats {
  double median = 0, min = 0, max = 0;
};

struct row {
  std::size_t bytes = 0;
  std::size_t count = 0;
  std::string dtype;
  std::string op;
  std::string algorithm;
  stats hspmd_time;
  stats mpi_time;
  double algbw = 0, busbw = 0, mpi_busbw = 0;
  long long wrong = -1;
  bool has_direct = true; ///< a direct call to compare with (NCCL has no uneven collectives)
  std::string direct = "mpi"; ///< what the direct call went through
};

// The sweep over communicator Comm whose buffers are Buffer (host vectors for MPI, device arrays
// for NCCL); `mpi` (the job's MPI communicator) times and agrees.
template <class T, class Comm = hspmd::mpi_communicator, class Buffer = std::vector<T>>
class sweep {
public:
  // Buffers are allocated once for the largest size: every row then runs on the same memory,
  // so no row pays for fresh pages or for the MPI library registering new buffers.
  sweep(hspmd::mpi_communicator& mpi, Comm& comm, const options& opt, std::vector<double> ratios,
        std::size_t max_bytes)
      : mpi_(mpi), comm_(comm), opt_(opt), ratios_(std::move(ratios)),
        n_(static_cast<std::size_t>(comm.size())), me_(static_cast<std::size_t>(comm.rank())),
        // all_to_all_v may receive up to n times a rank's share
        in_(make_buffer(max_bytes / sizeof(T) + n_)),
        out_(make_buffer((max_bytes / sizeof(T) + n_) * n_)) {}

  row run(hspmd::collective op, hspmd::uneven_algorithm alg, std::size_t bytes) {
    const std::size_t count = bytes / sizeof(T);
    setup(op, count);
    row r;
    r.bytes = count * sizeof(T);
    r.count = count;
    r.dtype = opt_.dtype;
    r.op = std::string(name(op));
    r.algorithm = hspmd::has_algorithms(op) ? std::string(name(alg)) : "-";
    if (alg == hspmd::uneven_algorithm::automatic && hspmd::has_algorithms(op))
      r.algorithm += ">" + std::string(name(comm_.choose(op, counts_, sizeof(T))));
    r.has_direct = has_direct(op);
    r.direct = on_mpi ? "mpi" : "nccl";
    std::tie(r.hspmd_time, r.mpi_time) =
        time([&] { call_hspmd(op, alg); }, [&] { call_direct(op); });
    const double factor = busbw_factor(op, static_cast<double>(n_));
    r.algbw = r.hspmd_time.median > 0 ? static_cast<double>(r.bytes) / r.hspmd_time.median : 0;
    r.busbw = r.algbw * factor;
    r.mpi_busbw =
        r.mpi_time.median > 0 ? static_cast<double>(r.bytes) / r.mpi_time.median * factor : 0;
    if (opt_.check != 0)
      r.wrong = check(op, alg);
    return r;
  }

private:
  [[nodiscard]] Buffer make_buffer(std::size_t elements) const {
    if constexpr (std::is_same_v<Buffer, std::vector<T>>) {
      Buffer b;
      b.reserve(elements);
      b.assign(elements, T{});
      return b;
    } else {
      return Buffer(elements, comm_.rank());
    }
  }

  static constexpr bool on_mpi = std::is_same_v<Comm, hspmd::mpi_communicator>;

  void setup(hspmd::collective op, std::size_t count) {
    using hspmd::collective;
    counts_ = hspmd::shard_lengths(count, ratios_);
    const std::size_t mine = counts_[me_];
    switch (op) {
    case collective::all_gather_v:
      in_.assign(mine, T{});
      out_.assign(count, T{});
      break;
    case collective::reduce_scatter_v:
      in_.assign(count, T{});
      out_.assign(mine, T{});
      break;
    case collective::all_to_all_v:
      // Rank r sends counts[s] elements to rank s, so it receives counts[r] from every rank.
      in_.assign(count, T{});
      recv_counts_.assign(n_, mine);
      out_.assign(mine * n_, T{});
      break;
    default:
      in_.assign(count, T{});
      out_.assign(count, T{});
    }
    mpi_counts_.clear();
    mpi_displs_.clear();
    int at = 0;
    for (std::size_t c : counts_) {
      mpi_counts_.push_back(static_cast<int>(c));
      mpi_displs_.push_back(at);
      at += static_cast<int>(c);
    }
    recv_mpi_counts_.assign(n_, static_cast<int>(mine));
    recv_mpi_displs_.clear();
    for (std::size_t r = 0; r < n_; ++r)
      recv_mpi_displs_.push_back(static_cast<int>(r * mine));
  }

  void call_hspmd(hspmd::collective op, hspmd::uneven_algorithm alg) {
    using hspmd::collective;
    switch (op) {
    case collective::all_reduce:
      comm_.all_reduce(in(), out(), hspmd::reduce_op::sum);
      break;
    case collective::broadcast:
      comm_.broadcast(std::span<T>(in_.data(), in_.size()), 0);
      break;
    case collective::all_gather_v:
      comm_.all_gather_v(in(), out(), counts_, alg);
      break;
    case collective::reduce_scatter_v:
      comm_.reduce_scatter_v(in(), out(), counts_, hspmd::reduce_op::sum, alg);
      break;
    case collective::all_to_all_v:
      comm_.all_to_all_v(in(), counts_, out(), recv_counts_);
      break;
    case collective::barrier:
      comm_.barrier();
      break;
    }
  }

  [[nodiscard]] std::span<const T> in() const { return {in_.data(), in_.size()}; }
  [[nodiscard]] std::span<T> out() { return {out_.data(), out_.size()}; }

  // Whether the operation has a direct call to compare with: every one on MPI; on NCCL the even
  // ones (NCCL has no v-collectives).
  [[nodiscard]] static bool has_direct(hspmd::collective op) {
    return on_mpi || op == hspmd::collective::all_reduce || op == hspmd::collective::broadcast;
  }

  void call_direct(hspmd::collective op) {
    if constexpr (on_mpi) {
      call_mpi(op);
    } else {
#if defined(HSPMD_HAS_NCCL)
      const ncclDataType_t t = hspmd::detail::nccl_datatype<T>();
      const cudaStream_t st = comm_.stream();
      ncclResult_t res = ncclSuccess;
      if (op == hspmd::collective::all_reduce)
        res = ncclAllReduce(in_.data(), out_.data(), in_.size(), t, ncclSum,
                            comm_.native_handle(), st);
      else if (op == hspmd::collective::broadcast)
        res = ncclBroadcast(in_.data(), in_.data(), in_.size(), t, 0, comm_.native_handle(), st);
      else
        return;
      if (res != ncclSuccess && res != ncclInProgress)
        throw hspmd::comm_error(comm_.rank(), "direct NCCL baseline", ncclGetErrorString(res));
      HSPMD_CUDA_CHECK(cudaStreamSynchronize(st), comm_.rank());
#endif
    }
  }

  void call_mpi(hspmd::collective op) {
    using hspmd::collective;
    MPI_Comm c = mpi_.native_handle();
    const MPI_Datatype t = mpi_type<T>();
    switch (op) {
    case collective::all_reduce:
      MPI_Allreduce(in_.data(), out_.data(), static_cast<int>(in_.size()), t, MPI_SUM, c);
      break;
    case collective::broadcast:
      MPI_Bcast(in_.data(), static_cast<int>(in_.size()), t, 0, c);
      break;
    case collective::all_gather_v:
      MPI_Allgatherv(in_.data(), static_cast<int>(in_.size()), t, out_.data(), mpi_counts_.data(),
                     mpi_displs_.data(), t, c);
      break;
    case collective::reduce_scatter_v:
      MPI_Reduce_scatter(in_.data(), out_.data(), mpi_counts_.data(), t, MPI_SUM, c);
      break;
    case collective::all_to_all_v:
      MPI_Alltoallv(in_.data(), mpi_counts_.data(), mpi_displs_.data(), t, out_.data(),
                    recv_mpi_counts_.data(), recv_mpi_displs_.data(), t, c);
      break;
    case collective::barrier:
      MPI_Barrier(c);
      break;
    }
  }

  // Times `a` and `b` in alternating iterations, so both see the same machine state.
  template <class A, class B>
  std::pair<stats, stats> time(A&& a, B&& b) {
    for (int i = 0; i < opt_.warmup; ++i) {
      a();
      b();
    }
    const auto n = static_cast<std::size_t>(opt_.iterations);
    std::vector<double> t(2 * n); // [a's times | b's times]
    for (std::size_t i = 0; i < n; ++i) {
      t[i] = timed(a);
      t[n + i] = timed(b);
    }
    // The slowest rank's time of each iteration.
    MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX,
                  mpi_.native_handle());
    const auto summarize = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return stats{v[v.size() / 2], v.front(), v.back()};
    };
    return {summarize({t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)}),
            summarize({t.begin() + static_cast<std::ptrdiff_t>(n), t.end()})};
  }

  template <class F>
  double timed(F&& call) {
    MPI_Barrier(mpi_.native_handle());
    const auto start = clock_type::now();
    call();
    return std::chrono::duration<double>(clock_type::now() - start).count();
  }

  // Runs the hspmd call once on known data; returns the number of wrong elements over all ranks.
  long long check(hspmd::collective op, hspmd::uneven_algorithm alg) {
    using hspmd::collective;
    const auto offsets = hspmd::shard_offsets(counts_);
    long long wrong = 0;
    const auto sum_over_ranks = [&](std::size_t i) {
      T s{};
      for (std::size_t r = 0; r < n_; ++r)
        s = static_cast<T>(s + value<T>(r, i));
      return s;
    };
    // Known data staged on the host, the call on the sweep's buffers, the results read back.
    const auto fill = [&](auto index) {
      std::vector<T> h(in_.size());
      for (std::size_t i = 0; i < h.size(); ++i)
        h[i] = value<T>(me_, index(i));
      upload(in_, h);
    };
    switch (op) {
    case collective::all_reduce:
    case collective::broadcast: {
      fill([](std::size_t i) { return i; });
      call_hspmd(op, alg);
      const auto got = download(op == collective::broadcast ? in_ : out_);
      for (std::size_t i = 0; i < in_.size(); ++i) {
        const T want = op == collective::broadcast ? value<T>(0, i) : sum_over_ranks(i);
        wrong += got[i] == want ? 0 : 1;
      }
      break;
    }
    case collective::all_gather_v: {
      fill([&](std::size_t i) { return offsets[me_] + i; });
      call_hspmd(op, alg);
      const auto got = download(out_);
      for (std::size_t r = 0; r < n_; ++r)
        for (std::size_t i = 0; i < counts_[r]; ++i)
          wrong += got[offsets[r] + i] == value<T>(r, offsets[r] + i) ? 0 : 1;
      break;
    }
    case collective::reduce_scatter_v: {
      fill([](std::size_t i) { return i; });
      call_hspmd(op, alg);
      const auto got = download(out_);
      for (std::size_t i = 0; i < got.size(); ++i)
        wrong += got[i] == sum_over_ranks(offsets[me_] + i) ? 0 : 1;
      break;
    }
    case collective::all_to_all_v: {
      fill([](std::size_t i) { return i; });
      call_hspmd(op, alg);
      const auto got = download(out_);
      // From rank r we got r's elements [offsets[me], offsets[me] + counts[me]).
      for (std::size_t r = 0; r < n_; ++r)
        for (std::size_t i = 0; i < counts_[me_]; ++i)
          wrong += got[r * counts_[me_] + i] == value<T>(r, offsets[me_] + i) ? 0 : 1;
      break;
    }
    case collective::barrier:
      break;
    }
    return mpi_.all_reduce(static_cast<std::int64_t>(wrong), hspmd::reduce_op::sum);
  }

  hspmd::mpi_communicator& mpi_;
  Comm& comm_;
  const options& opt_;
  std::vector<double> ratios_;
  std::size_t n_;
  std::size_t me_;
  std::vector<std::size_t> counts_;
  std::vector<std::size_t> recv_counts_;
  std::vector<int> mpi_counts_, mpi_displs_, recv_mpi_counts_, recv_mpi_displs_;
  Buffer in_, out_;
};

void print_header(const options& opt, int ranks, const std::string& ratios) {
  std::printf("# hspmd-collectives: %d ranks, backend %s, dtype %s, ratios %s, %d iterations "
              "(%d warm-up), check %s\n",
              ranks, opt.backend.c_str(), opt.dtype.c_str(), ratios.c_str(), opt.iterations,
              opt.warmup, opt.check != 0 ? "on" : "off");
  std::printf(
      "# times are per call, slowest rank; algbw = size / median; busbw as nccl-tests\n#\n");
  std::printf("# %11s %10s %4s %-16s %-18s %9s %9s %9s %7s %7s %6s | %9s %7s %8s\n", "size",
              "count", "type", "op", "algorithm", "median", "min", "max", "algbw", "busbw",
              "#wrong", opt.backend == "nccl" ? "NCCL med" : "MPI med",
              opt.backend == "nccl" ? "NCCL bus" : "MPI bus", "overhead");
  std::printf("# %11s %10s %4s %-16s %-18s %9s %9s %9s %7s %7s %6s | %9s %7s %8s\n", "(B)",
              "(elements)", "", "", "", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
              "(GB/s)", "");
}

void print_row(const row& r) {
  const std::string wrong = r.wrong < 0 ? "n/a" : std::to_string(r.wrong);
  if (!r.has_direct) {
    std::printf("  %11zu %10zu %4s %-16s %-18s %9.2f %9.2f %9.2f %7.3f %7.3f %6s | %9s %7s %8s\n",
                r.bytes, r.count, r.dtype.c_str(), r.op.c_str(), r.algorithm.c_str(),
                1e6 * r.hspmd_time.median, 1e6 * r.hspmd_time.min, 1e6 * r.hspmd_time.max,
                r.algbw / 1e9, r.busbw / 1e9, wrong.c_str(), "-", "-", "-");
    return;
  }
  std::printf(
      "  %11zu %10zu %4s %-16s %-18s %9.2f %9.2f %9.2f %7.3f %7.3f %6s | %9.2f %7.3f "
      "%+7.1f%%\n",
      r.bytes, r.count, r.dtype.c_str(), r.op.c_str(), r.algorithm.c_str(),
      1e6 * r.hspmd_time.median, 1e6 * r.hspmd_time.min, 1e6 * r.hspmd_time.max, r.algbw / 1e9,
      r.busbw / 1e9, wrong.c_str(), 1e6 * r.mpi_time.median, r.mpi_busbw / 1e9,
      r.mpi_time.median > 0 ? 100.0 * (r.hspmd_time.median / r.mpi_time.median - 1.0) : 0.0);
}

nlohmann::json to_json(const row& r) {
  nlohmann::json j = {{"bytes", r.bytes},
          {"count", r.count},
          {"dtype", r.dtype},
          {"op", r.op},
          {"algorithm", r.algorithm},
          {"time_us",
           {{"median", 1e6 * r.hspmd_time.median},
            {"min", 1e6 * r.hspmd_time.min},
            {"max", 1e6 * r.hspmd_time.max}}},
          {"algbw_GBps", r.algbw / 1e9},
          {"busbw_GBps", r.busbw / 1e9},
          {"wrong", r.wrong}};
  if (r.has_direct)
    j[r.direct] = {{"time_us",
                    {{"median", 1e6 * r.mpi_time.median},
                     {"min", 1e6 * r.mpi_time.min},
                     {"max", 1e6 * r.mpi_time.max}}},
                   {"busbw_GBps", r.mpi_busbw / 1e9}};
  return j;
}

template <class T, class Comm = hspmd::mpi_communicator, class Buffer = std::vector<T>>
long long run_sweep(hspmd::mpi_communicator& mpi, Comm& comm, const options& opt,
                    const std::vector<double>& ratios, nlohmann::json& rows) {
  using hspmd::collective;
  using hspmd::uneven_algorithm;
  std::vector<collective> ops;
  const std::vector<collective> all_ops = {collective::all_reduce, collective::broadcast,
                                           collective::all_gather_v, collective::reduce_scatter_v,
                                           collective::all_to_all_v};
  for (collective c : all_ops)
    if (opt.op == "all" || opt.op == name(c))
      ops.push_back(c);
  if (ops.empty())
    throw hspmd::config_error("flag --op " + opt.op, "unknown collective",
                              "all, all_reduce, broadcast, all_gather_v, reduce_scatter_v or "
                              "all_to_all_v");
  std::vector<uneven_algorithm> algs;
  if (opt.algo == "all") {
    algs = {uneven_algorithm::automatic, uneven_algorithm::padded, uneven_algorithm::grouped,
            uneven_algorithm::native};
  } else if (const auto a = hspmd::parse_uneven_algorithm(opt.algo)) {
    algs = {*a};
  } else {
    throw hspmd::config_error("flag --algo " + opt.algo, "unknown algorithm",
                              "automatic, padded, grouped, native or all");
  }
  const std::size_t lo = parse_bytes(opt.min_bytes, "-b");
  const std::size_t hi = parse_bytes(opt.max_bytes, "-e");
  if (lo > hi || !(opt.factor > 1.0))
    throw hspmd::config_error("flags -b/-e/-f", "empty or endless size range",
                              "-b <= -e and -f > 1");
  sweep<T, Comm, Buffer> s(mpi, comm, opt, ratios, hi);
  long long wrong = 0;
  for (collective op : ops)
    for (uneven_algorithm alg : algs) {
      if (!hspmd::has_algorithms(op) && alg != algs.front())
        continue; // one row per size for collectives without algorithms
      for (double bytes = static_cast<double>(lo); bytes <= static_cast<double>(hi);
           bytes = std::max(bytes * opt.factor, bytes + 1)) {
        const row r = s.run(op, alg, static_cast<std::size_t>(bytes));
        wrong += std::max(0LL, r.wrong);
        if (comm.rank() == 0) {
          print_row(r);
          rows.push_back(to_json(r));
        }
      }
    }
  return wrong;
}

int run(int argc, char** argv) {
  options opt;
  CLI::App app{"hspmd-collectives: nccl-tests style sweep of hspmd's collectives next to direct "
               "MPI calls"};
  app.add_option("-b,--minbytes", opt.min_bytes, "smallest size (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", opt.max_bytes, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", opt.factor, "size multiplier between rows")
      ->capture_default_str();
  app.add_option("-n,--iters", opt.iterations, "timed iterations per size")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("-w,--warmup_iters", opt.warmup, "untimed iterations first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_option("-c,--check", opt.check, "check results (0/1): prints #wrong")
      ->capture_default_str();
  app.add_option("--op", opt.op,
                 "all, all_reduce, broadcast, all_gather_v, reduce_scatter_v, all_to_all_v "
                 "(nccl-tests' allreduce, allgather, reducescatter, alltoall work too)")
      ->capture_default_str();
  app.add_option("--algo", opt.algo, "automatic, padded, grouped, native or all")
      ->capture_default_str();
  app.add_option("--ratios", opt.ratios, "uneven split across ranks, e.g. 4:2:1 (default even)");
  app.add_option("--backend", opt.backend, "mpi or nccl")->capture_default_str();
  app.add_option("-d,--dtype", opt.dtype, "f32 (float), f64 (double) or i32 (int32)")
      ->capture_default_str();
  app.add_option("--json", opt.json_file, "also write the rows to this JSON file");
  app.add_option("--cluster", opt.cluster_file,
                 "take automatic's cost model from this cluster file");
  app.add_flag("--calibrate", opt.calibrate,
               "measure the cost model first (and print it as a cluster-file section)");
  if (const auto rc = hspmd::io::parse_flags(app, argc, argv))
    return *rc;
  opt.op = nccl_tests_spelling(opt.op);
  opt.dtype = nccl_tests_spelling(opt.dtype);

  hspmd::mpi_communicator comm;
  if (opt.backend != "mpi" && opt.backend != "nccl")
    throw hspmd::config_error("flag --backend " + opt.backend, "unknown backend", "mpi or nccl");
#if !defined(HSPMD_HAS_NCCL)
  if (opt.backend == "nccl")
    throw hspmd::config_error("flag --backend nccl",
                              "this build has no NCCL backend (CUDA and NCCL were not found when "
                              "it was configured)",
                              "install the CUDA toolkit with NCCL and rebuild, or use --backend mpi");
#endif
  if (opt.backend == "nccl" && opt.calibrate)
    throw hspmd::config_error("flag --calibrate", "calibrates the MPI backend only",
                              "drop --calibrate with --backend nccl");
#if defined(HSPMD_HAS_NCCL)
  if (opt.backend == "nccl") // before any output: a rank without a GPU says so and nothing else
    hspmd::select_local_device(
        comm, "run --backend nccl where every rank has a GPU, or use --backend mpi");
#endif
  const auto ratios = parse_ratios(opt.ratios, comm.size());
  if (!opt.cluster_file.empty()) {
    const auto c = hspmd::load_cluster(opt.cluster_file);
    hspmd::check_rank_count(c, static_cast<std::size_t>(comm.size()));
    comm.set_cost_model(c.cost_model());
  }
  if (opt.calibrate) {
    // Calibrate over the sizes this sweep covers (factor 4 apart, at least 1 KiB).
    hspmd::calibration_options cal;
    cal.sizes_bytes.clear();
    const std::size_t top = parse_bytes(opt.max_bytes, "-e");
    for (std::size_t b = std::max<std::size_t>(parse_bytes(opt.min_bytes, "-b"), 1024); b <= top;
         b *= 4)
      cal.sizes_bytes.push_back(b);
    if (cal.sizes_bytes.empty() || cal.sizes_bytes.back() != top)
      cal.sizes_bytes.push_back(std::max<std::size_t>(top, 1024));
    comm.set_cost_model(hspmd::calibrate_collectives(comm, cal));
    if (comm.rank() == 0)
      std::printf("# calibrated cost model (a cluster file's \"collectives\" section):\n# %s\n",
                  hspmd::collectives_to_json(comm.cost_model()).dump().c_str());
  }
  std::string ratio_text = opt.ratios.empty() ? "even" : opt.ratios;
  if (comm.rank() == 0)
    print_header(opt, comm.size(), ratio_text);

  nlohmann::json rows = nlohmann::json::array();
  long long wrong = 0;
  if (opt.dtype != "f32" && opt.dtype != "f64" && opt.dtype != "i32")
    throw hspmd::config_error("flag --dtype " + opt.dtype, "unknown element type",
                              "f32, f64 or i32");
  if (opt.backend == "mpi") {
    if (opt.dtype == "f32")
      wrong = run_sweep<float>(comm, comm, opt, ratios, rows);
    else if (opt.dtype == "f64")
      wrong = run_sweep<double>(comm, comm, opt, ratios, rows);
    else
      wrong = run_sweep<std::int32_t>(comm, comm, opt, ratios, rows);
  }
#if defined(HSPMD_HAS_NCCL)
  if (opt.backend == "nccl") {
    hspmd::nccl_communicator nccl(comm);
    nccl.set_cost_model(comm.cost_model());
    using hspmd::nccl_communicator;
    if (opt.dtype == "f32")
      wrong = run_sweep<float, nccl_communicator, device_array<float>>(comm, nccl, opt, ratios,
                                                                       rows);
    else if (opt.dtype == "f64")
      wrong = run_sweep<double, nccl_communicator, device_array<double>>(comm, nccl, opt, ratios,
                                                                         rows);
    else
      wrong = run_sweep<std::int32_t, nccl_communicator, device_array<std::int32_t>>(
          comm, nccl, opt, ratios, rows);
  }
#endif

  if (comm.rank() == 0) {
    std::printf("# total #wrong: %lld\n", wrong);
    if (!opt.json_file.empty()) {
      std::ofstream out(opt.json_file);
      out << nlohmann::json{{"ranks", comm.size()},
                            {"ratios", ratio_text},
                            {"iterations", opt.iterations},
                            {"rows", rows}}
                 .dump(2)
          << "\n";
      if (!out)
        throw hspmd::config_error(opt.json_file, "cannot write", "check the path");
    }
  }
  return wrong == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  hspmd::mpi_environment env(argc, argv);
  return hspmd::run_guarded([&] { return run(argc, argv); });
}

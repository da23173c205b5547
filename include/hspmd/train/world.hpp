#pragma once
// The ranks a training run spans, as the trainer's loop and its services see them. The base
// class is one process (rank 0 of 1: every collective is the identity); a distributed run's
// ranks are train/distributed_start.hpp's `mpi_world`, so the loop and the services read the
// same calls either way and never name MPI. Collective calls are made by every rank in step.

#include <hspmd/train/namespace.hpp>

#include <functional>
#include <string>
#include <vector>

namespace hspmd::train {

/// One process; a distributed run overrides every call (see the file comment).
class world {
public:
  world() = default;
  world(const world&) = delete;
  world& operator=(const world&) = delete;
  virtual ~world() = default;

  [[nodiscard]] virtual int rank() const { return 0; }
  [[nodiscard]] virtual int size() const { return 1; }
  [[nodiscard]] bool root() const { return rank() == 0; }
  /// What this rank is doing, named if a wait of the run times out.
  virtual void set_phase(std::string phase) { (void)phase; }
  /// Runs `body`; in a distributed run an exception on any rank ends every rank with one line
  /// (comm/mpi/guard.hpp) instead of leaving the others waiting.
  virtual void guarded(const std::function<void()>& body) { body(); }
  /// Rank 0's `text` on every rank. Collective.
  virtual void broadcast_text(std::string& text) { (void)text; }
  /// Rank 0's `values` on every rank. Collective.
  virtual void broadcast(std::vector<double>& values) { (void)values; }
  /// Every rank's `mine`, in rank order. Collective.
  [[nodiscard]] virtual std::vector<double> all_gather(double mine) { return {mine}; }
};

} // namespace hspmd::train

#include "gpu/host_collective.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace depot::gpu {

class HostCollective : public Collective {
 public:
  HostCollective(std::shared_ptr<HostCollectiveGroup> group, int rank,
                 Device& device)
      : group_(std::move(group)), rank_(rank), device_(device) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size_; }

  absl::Status ReduceScatterSum(const void* send, void* recv, size_t count,
                                DType dtype, Stream& stream) override {
    return Queue({HostCollectiveGroup::Op::kReduceScatter, send, recv, count,
                  dtype},
                 stream);
  }
  absl::Status AllGather(const void* send, void* recv, size_t count,
                         DType dtype, Stream& stream) override {
    return Queue(
        {HostCollectiveGroup::Op::kAllGather, send, recv, count, dtype},
        stream);
  }
  absl::Status AllReduceSum(float* data, size_t count,
                            Stream& stream) override {
    return Queue({HostCollectiveGroup::Op::kAllReduce, data, data, count,
                  DType::kFloat32},
                 stream);
  }

  void Abort() override { group_->Abort(rank_); }
  absl::Status AsyncError() override { return group_->AsyncError(rank_); }

 private:
  absl::Status Queue(const HostCollectiveGroup::Call& call, Stream& stream) {
    if (group_->aborted()) {
      return absl::FailedPreconditionError(
          "collective: the node's collectives were aborted");
    }
    if (call.count > 0 && (call.send == nullptr || call.recv == nullptr)) {
      return absl::InvalidArgumentError("collective: a null buffer");
    }
    if (!DTypeFromWire(static_cast<int>(call.dtype)).ok()) {
      return absl::InvalidArgumentError("collective: unknown dtype");
    }
    const uint64_t sequence = next_++;
    absl::Status queued = device_.LaunchHostFunc(
        stream, [group = group_, rank = rank_, sequence, call] {
          group->Run(rank, sequence, call);
        });
    if (!queued.ok()) --next_;  // nothing was queued: the position is free
    return queued;
  }

  const std::shared_ptr<HostCollectiveGroup> group_;
  const int rank_;
  Device& device_;
  uint64_t next_ = 0;  // calls are made from one thread per rank
};

std::shared_ptr<HostCollectiveGroup> HostCollectiveGroup::Create(int size) {
  return std::shared_ptr<HostCollectiveGroup>(new HostCollectiveGroup(size));
}

std::unique_ptr<Collective> HostCollectiveGroup::Join(int rank,
                                                      Device& device) {
  return std::make_unique<HostCollective>(shared_from_this(), rank, device);
}

std::vector<std::string> HostCollectiveGroup::errors() const {
  absl::MutexLock lock(&mu_);
  return errors_;
}

void HostCollectiveGroup::Abort(int rank) {
  absl::MutexLock lock(&mu_);
  if (aborted_by_ < 0) aborted_by_ = rank;
  // A rank still reading another's buffers finishes first: the other may
  // free them once its calls have ended.
  const auto quiet = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return computing_ == 0;
  };
  mu_.Await(absl::Condition(&quiet));
}

absl::Status HostCollectiveGroup::AsyncError(int rank) const {
  absl::MutexLock lock(&mu_);
  if (aborted_by_ < 0 || aborted_by_ == rank) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "local rank ", aborted_by_, " aborted the node's collectives"));
}

bool HostCollectiveGroup::aborted() const {
  absl::MutexLock lock(&mu_);
  return aborted_by_ >= 0;
}

void HostCollectiveGroup::Run(int rank, uint64_t sequence, const Call& call) {
  absl::MutexLock lock(&mu_);
  // After an abort every call ends where it is, computing nothing; its
  // round is left behind (the group is done).
  if (aborted_by_ >= 0) return;
  Round& round = rounds_[sequence];  // std::map: stable while others insert
  if (round.calls.empty()) round.calls.resize(size_);
  round.calls[rank] = call;
  // Three barriers: every call is in (rank 0 then checks that they match);
  // every rank has read what it needs (so an in-place all-reduce may write);
  // every rank has written (so the round can go). Each returns false once
  // the group is aborted.
  const auto reach = [&](int Round::*counter) {
    ++(round.*counter);
    const auto all = [&round, counter, this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                           return round.*counter == size_ || aborted_by_ >= 0;
                         };
    mu_.Await(absl::Condition(&all));
    return aborted_by_ < 0;
  };
  if (!reach(&Round::arrived)) return;
  if (rank == 0) {
    for (int r = 1; r < size_ && !round.mismatch; ++r) {
      const Call& a = round.calls[0];
      const Call& b = round.calls[r];
      if (a.op != b.op || a.count != b.count || a.dtype != b.dtype) {
        round.mismatch = true;
        errors_.push_back(absl::StrCat(
            "collective call ", sequence, ": rank ", r,
            " made another call (op, count or dtype) than rank 0"));
      }
    }
    round.checked = true;
  }
  const auto checked = [&round, this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return round.checked || aborted_by_ >= 0;
  };
  mu_.Await(absl::Condition(&checked));
  if (aborted_by_ >= 0) return;
  std::string result;
  if (!round.mismatch) {
    ++computing_;
    mu_.Unlock();
    result = Compute(rank, round);
    mu_.Lock();
    --computing_;
  }
  if (!reach(&Round::computed)) return;
  if (!round.mismatch) {
    std::memcpy(round.calls[rank].recv, result.data(), result.size());
  }
  if (!reach(&Round::written)) return;
  if (++round.left == size_) rounds_.erase(sequence);
}

std::string HostCollectiveGroup::Compute(int rank, const Round& round) const {
  const Call& mine = round.calls[rank];
  const size_t elem = DTypeSize(mine.dtype);
  if (mine.op == Op::kAllGather) {
    std::string out(size_ * mine.count * elem, '\0');
    for (int r = 0; r < size_; ++r) {
      std::memcpy(out.data() + r * mine.count * elem, round.calls[r].send,
                  mine.count * elem);
    }
    return out;
  }
  // Reduce-scatter: this rank's slice of every rank's send buffer; all-reduce:
  // the whole buffer. Summed in fp32 in rank order, rounded once.
  const size_t offset = mine.op == Op::kReduceScatter ? rank * mine.count : 0;
  std::vector<float> sum(mine.count, 0.0f);
  std::vector<float> part(mine.count);
  for (int r = 0; r < size_; ++r) {
    ConvertToFloat(mine.dtype,
                   static_cast<const char*>(round.calls[r].send) +
                       offset * elem,
                   part.data(), mine.count);
    for (size_t i = 0; i < mine.count; ++i) {
      sum[i] = r == 0 ? part[i] : sum[i] + part[i];
    }
  }
  std::string out(mine.count * elem, '\0');
  ConvertFromFloat(sum.data(), mine.dtype, out.data(), mine.count);
  return out;
}

}  // namespace depot::gpu

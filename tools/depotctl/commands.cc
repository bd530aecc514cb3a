#include "tools/depotctl/commands.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "channel.h"
#include "depot/json_text.h"
#include "wire/wire.h"

namespace depot::ctl {
namespace {

using client_internal::WithServer;

// Rows printed as aligned columns, the first row the header.
class Table {
 public:
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print() const {
    std::vector<size_t> widths;
    for (const auto& row : rows_) {
      widths.resize(std::max(widths.size(), row.size()));
      for (size_t i = 0; i < row.size(); ++i) {
        widths[i] = std::max(widths[i], row[i].size());
      }
    }
    for (const auto& row : rows_) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        absl::StrAppend(&line, row[i],
                        i + 1 < row.size()
                            ? std::string(widths[i] - row[i].size() + 2, ' ')
                            : "");
      }
      std::printf("%s\n", line.c_str());
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.1f %s", bytes, units[unit]);
}

std::string Duration(double seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds < 120) return absl::StrFormat("%.0fs", seconds);
  if (seconds < 7200) return absl::StrFormat("%.0fm", seconds / 60);
  if (seconds < 172800) return absl::StrFormat("%.1fh", seconds / 3600);
  return absl::StrFormat("%.1fd", seconds / 86400);
}

std::string JsonError(const absl::Status& status) {
  return status.ok() ? "null" : JsonString(status.ToString());
}

std::string JsonUints(const google::protobuf::RepeatedField<uint32_t>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ","), "]");
}

std::string JsonSteps(const std::vector<uint64_t>& steps) {
  return absl::StrCat("[", absl::StrJoin(steps, ","), "]");
}

void PrintError(const absl::Status& status) {
  std::fprintf(stderr, "depotctl: %s\n", status.ToString().c_str());
}

// The age of the server's last checkpoint, or a negative value for none.
double CheckpointAge(const v1::ServerStatusResponse& status) {
  if (status.checkpoint_last_success() <= 0) return -1;
  return status.time() - status.checkpoint_last_success();
}

std::string JobJson(const v1::JobSummary& job) {
  return absl::StrCat(
      "{\"id\":", job.job_id(), ",\"name\":", JsonString(job.name()),
      ",\"tenant\":", JsonString(job.tenant()),
      ",\"server_index\":", job.server_index(),
      ",\"num_servers\":", job.num_servers(),
      ",\"num_workers\":", job.num_workers(), ",\"step\":", job.step(),
      ",\"newest_step\":", job.newest_step(),
      ",\"pending_step\":", job.pending_step(),
      ",\"missing_workers\":", JsonUints(job.missing_workers()),
      ",\"waiting_seconds\":", JsonNumber(job.waiting_seconds()),
      ",\"shard_params\":", job.shard_params(),
      ",\"state_bytes\":", job.state_bytes(),
      ",\"newest_checkpoint_step\":", job.newest_checkpoint_step(), "}");
}

// Rates between two readings of one server, by its own clock.
struct Rates {
  bool valid = false;
  double steps = 0, chunks = 0, received = 0, sent = 0;
};

Rates RatesBetween(const ServerReading& first, const ServerReading& second) {
  Rates rates;
  if (!first.status.ok() || !second.status.ok()) return rates;
  const v1::ServerStatusResponse& a = first.response;
  const v1::ServerStatusResponse& b = second.response;
  const double seconds = b.time() - a.time();
  // A restart between the readings resets the counters.
  if (seconds <= 0 || a.start_time() != b.start_time()) return rates;
  auto rate = [seconds](uint64_t before, uint64_t after) {
    return after >= before ? static_cast<double>(after - before) / seconds
                           : 0.0;
  };
  rates.valid = true;
  rates.steps = rate(a.steps_completed(), b.steps_completed());
  rates.chunks = rate(a.chunks_updated(), b.chunks_updated());
  rates.received = rate(a.received_bytes(), b.received_bytes());
  rates.sent = rate(a.sent_bytes(), b.sent_bytes());
  return rates;
}

std::string ServerJson(const ServerReading& reading, const Rates& rates) {
  std::string out = absl::StrCat("{\"address\":", JsonString(reading.address),
                                 ",\"ok\":", reading.status.ok() ? "true" : "false",
                                 ",\"error\":", JsonError(reading.status));
  if (!reading.status.ok()) return out + "}";
  const v1::ServerStatusResponse& s = reading.response;
  const double age = CheckpointAge(s);
  absl::StrAppend(
      &out, ",\"version\":", JsonString(s.version()),
      ",\"draining\":", s.draining() ? "true" : "false",
      ",\"uptime_seconds\":", JsonNumber(s.time() - s.start_time()),
      ",\"memory_used_bytes\":", s.memory_used_bytes(),
      ",\"memory_limit_bytes\":", s.memory_limit_bytes(),
      ",\"state_bytes\":", s.state_bytes(),
      ",\"active_streams\":", s.active_streams(),
      ",\"checkpoints_enabled\":", s.checkpoints_enabled() ? "true" : "false",
      ",\"checkpoint_every_steps\":", s.checkpoint_every_steps(),
      ",\"checkpoint_age_seconds\":", age < 0 ? "null" : JsonNumber(age),
      ",\"checkpoints_written\":", s.checkpoints_written(),
      ",\"checkpoint_failures\":", s.checkpoint_failures(),
      ",\"steps_completed\":", s.steps_completed(),
      ",\"chunks_updated\":", s.chunks_updated(),
      ",\"received_bytes\":", s.received_bytes(),
      ",\"sent_bytes\":", s.sent_bytes(), ",\"rollbacks\":", s.rollbacks(),
      ",\"jobs_restored\":", s.jobs_restored(),
      ",\"all_tenants\":", s.all_tenants() ? "true" : "false",
      ",\"caller_tenant\":", JsonString(s.caller_tenant()));
  if (rates.valid) {
    absl::StrAppend(&out, ",\"rates\":{\"steps_per_second\":",
                    JsonNumber(rates.steps), ",\"chunks_per_second\":",
                    JsonNumber(rates.chunks),
                    ",\"received_bytes_per_second\":",
                    JsonNumber(rates.received),
                    ",\"sent_bytes_per_second\":", JsonNumber(rates.sent), "}");
  } else {
    absl::StrAppend(&out, ",\"rates\":null");
  }
  std::vector<std::string> jobs;
  for (const v1::JobSummary& job : s.jobs()) jobs.push_back(JobJson(job));
  absl::StrAppend(&out, ",\"jobs\":[", absl::StrJoin(jobs, ","), "]}");
  return out;
}

int CountUnreachable(const std::vector<ServerReading>& readings) {
  int unreachable = 0;
  for (const ServerReading& reading : readings) {
    if (!reading.status.ok()) {
      PrintError(reading.status);
      ++unreachable;
    }
  }
  return unreachable;
}

// " of tenant T", or "" for the implicit tenant: job names are per tenant.
std::string OfTenant(const std::string& tenant) {
  return tenant.empty() ? std::string()
                        : absl::StrCat(" of tenant \"", tenant, "\"");
}

// Reads the fleet's status and finds `name` in it; prints why not.
absl::StatusOr<FleetJob> ResolveJob(const Fleet& fleet,
                                    const std::string& name) {
  const std::vector<ServerReading> readings = ReadStatus(fleet);
  CountUnreachable(readings);
  return FindJob(readings, name);
}

// Whether every server of the job's config holds its shard.
bool Complete(const FleetJob& job) {
  std::set<uint32_t> indices;
  for (const FleetJob::Shard& shard : job.shards) {
    indices.insert(shard.job.server_index());
  }
  return indices.size() == job.num_servers;
}

void WarnIncomplete(const FleetJob& job) {
  std::fprintf(stderr,
               "depotctl: job \"%s\" has %zu of its %u servers among those "
               "given (or answering): give every server in --servers\n",
               job.name.c_str(), job.shards.size(), job.num_servers);
}

int NotFound(const absl::Status& status) {
  PrintError(status);
  return absl::IsNotFound(status) ? kExitNotFound : kExitFailed;
}

// The job named `name` on every server of its config, or the exit code to
// return: it is on none (4), or on fewer than its config says (1: `what`
// needs every server).
absl::StatusOr<FleetJob> ResolveWholeJob(const Fleet& fleet,
                                         const std::string& name,
                                         const char* what, int* exit_code) {
  absl::StatusOr<FleetJob> job = ResolveJob(fleet, name);
  if (!job.ok()) {
    *exit_code = NotFound(job.status());
    return job.status();
  }
  if (!Complete(*job)) {
    WarnIncomplete(*job);
    std::fprintf(stderr, "depotctl: not %s: every server of the job must\n",
                 what);
    *exit_code = kExitFailed;
    return absl::FailedPreconditionError("incomplete");
  }
  return job;
}

// The answers of one RPC on shards of a job, by shard.
template <typename Response>
struct ShardCalls {
  std::vector<absl::Status> status;
  std::vector<Response> response;
};

// Calls `rpc` with `request` (its job id and fingerprint set to each
// shard's) on every shard of `job` that `selected` accepts (all by
// default), at once; a shard not called keeps an OK status.
template <typename Request, typename Response>
ShardCalls<Response> CallShards(
    const Fleet& fleet, const FleetJob& job, Request request,
    grpc::Status (v1::Depot::Stub::*rpc)(grpc::ClientContext*, const Request&,
                                         Response*),
    const std::function<bool(const FleetJob::Shard&)>& selected = nullptr) {
  ShardCalls<Response> calls;
  calls.status.resize(job.shards.size());
  calls.response.resize(job.shards.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < job.shards.size(); ++k) {
    const FleetJob::Shard& shard = job.shards[k];
    if (selected && !selected(shard)) continue;
    threads.emplace_back([&, k, request]() mutable {
      request.set_job_id(shard.job.job_id());
      request.set_fingerprint(shard.job.fingerprint());
      std::unique_ptr<grpc::ClientContext> context = fleet.NewContext();
      calls.status[k] = WithServer(
          FromGrpcStatus((fleet.stub(shard.server).*rpc)(
              context.get(), request, &calls.response[k])),
          fleet.address(shard.server));
    });
  }
  for (std::thread& thread : threads) thread.join();
  return calls;
}

}  // namespace

int Status(const Fleet& fleet, const CommandOptions& options) {
  std::vector<ServerReading> first = ReadStatus(fleet);
  std::vector<ServerReading> readings = first;
  std::vector<Rates> rates(fleet.size());
  if (options.sample > absl::ZeroDuration()) {
    absl::SleepFor(options.sample);
    readings = ReadStatus(fleet);
    for (size_t i = 0; i < fleet.size(); ++i) {
      rates[i] = RatesBetween(first[i], readings[i]);
    }
  }
  const int unreachable = CountUnreachable(readings);
  if (options.json) {
    std::vector<std::string> servers;
    for (size_t i = 0; i < readings.size(); ++i) {
      servers.push_back(ServerJson(readings[i], rates[i]));
    }
    std::printf("{\"servers\":[%s],\"reachable\":%zu,\"unreachable\":%d}\n",
                absl::StrJoin(servers, ",").c_str(),
                readings.size() - unreachable, unreachable);
  } else {
    Table table;
    table.Add({"SERVER", "STATE", "UPTIME", "JOBS", "MEMORY (used / budget)",
               "STEPS/s", "UPDATES/s", "IN/s", "OUT/s", "LAST CHECKPOINT"});
    for (size_t i = 0; i < readings.size(); ++i) {
      const ServerReading& r = readings[i];
      if (!r.status.ok()) {
        table.Add({r.address, "UNREACHABLE"});
        continue;
      }
      const v1::ServerStatusResponse& s = r.response;
      const double age = CheckpointAge(s);
      const Rates& rate = rates[i];
      table.Add(
          {r.address, s.draining() ? "draining" : "serving",
           Duration(s.time() - s.start_time()), absl::StrCat(s.jobs_size()),
           absl::StrCat(Bytes(s.memory_used_bytes()), " / ",
                        Bytes(s.memory_limit_bytes())),
           rate.valid ? absl::StrFormat("%.2f", rate.steps) : "-",
           rate.valid ? absl::StrFormat("%.1f", rate.chunks) : "-",
           rate.valid ? Bytes(rate.received) : "-",
           rate.valid ? Bytes(rate.sent) : "-",
           !s.checkpoints_enabled() ? "off"
           : age < 0                ? "none yet"
                                    : absl::StrCat(Duration(age), " ago")});
    }
    table.Print();
    for (const ServerReading& r : readings) {
      if (!r.status.ok()) continue;
      for (const v1::JobSummary& job : r.response.jobs()) {
        std::string line = absl::StrFormat(
            "  %s  job \"%s\"%s: server %d of %d, step %d", r.address,
            job.name(),
            job.tenant().empty() ? ""
                                 : absl::StrCat(" (tenant ", job.tenant(), ")"),
            job.server_index(), job.num_servers(), job.step());
        if (job.newest_step() != job.step()) {
          absl::StrAppend(&line, " (", job.newest_step(), " half applied)");
        }
        if (job.pending_step() != 0 && !job.missing_workers().empty()) {
          absl::StrAppend(&line, absl::StrFormat(
                                     ", step %d waits %.1fs for workers [%s]",
                                     job.pending_step(), job.waiting_seconds(),
                                     absl::StrJoin(job.missing_workers(), ",")));
        }
        if (job.newest_checkpoint_step() != 0) {
          absl::StrAppend(&line, ", checkpoint of step ",
                          job.newest_checkpoint_step());
        }
        std::printf("%s\n", line.c_str());
      }
    }
  }
  return unreachable > 0 ? kExitDegraded : kExitOk;
}

int Jobs(const Fleet& fleet, const CommandOptions& options) {
  const std::vector<ServerReading> readings = ReadStatus(fleet);
  const int unreachable = CountUnreachable(readings);
  const std::vector<FleetJob> jobs = GroupJobs(readings);
  bool all_complete = true;
  std::vector<std::string> json;
  Table table;
  table.Add({"JOB", "TENANT", "SERVERS", "WORKERS", "STEP", "WAITING FOR",
             "STATE", "CHECKPOINT"});
  for (const FleetJob& job : jobs) {
    const bool complete = Complete(job);
    all_complete = all_complete && complete;
    uint64_t step_min = UINT64_MAX, step_max = 0, newest = 0, state = 0;
    uint64_t checkpoint = UINT64_MAX;
    std::set<uint32_t> missing;
    std::vector<std::string> shards;
    for (const FleetJob::Shard& shard : job.shards) {
      const v1::JobSummary& j = shard.job;
      step_min = std::min(step_min, j.step());
      step_max = std::max(step_max, j.step());
      newest = std::max(newest, j.newest_step());
      state += j.state_bytes();
      checkpoint = std::min(checkpoint, j.newest_checkpoint_step());
      missing.insert(j.missing_workers().begin(), j.missing_workers().end());
      shards.push_back(absl::StrCat(
          "{\"server\":", JsonString(fleet.address(shard.server)),
          ",\"server_index\":", j.server_index(), ",\"job_id\":", j.job_id(),
          ",\"step\":", j.step(), ",\"newest_step\":", j.newest_step(),
          ",\"newest_checkpoint_step\":", j.newest_checkpoint_step(), "}"));
    }
    // The newest step every server holds a checkpoint of is at most the
    // smallest newest; 0 when one holds none.
    if (!complete) checkpoint = 0;
    const std::string& tenant = job.tenant;
    json.push_back(absl::StrCat(
        "{\"name\":", JsonString(job.name), ",\"tenant\":", JsonString(tenant),
        ",\"num_servers\":", job.num_servers,
        ",\"servers_holding\":", job.shards.size(),
        ",\"complete\":", complete ? "true" : "false",
        ",\"num_workers\":", job.shards.front().job.num_workers(),
        ",\"step_min\":", step_min, ",\"step_max\":", step_max,
        ",\"newest_step\":", newest, ",\"missing_workers\":[",
        absl::StrJoin(missing, ","), "],\"state_bytes\":", state,
        ",\"newest_checkpoint_step\":", checkpoint, ",\"shards\":[",
        absl::StrJoin(shards, ","), "]}"));
    table.Add({job.name, tenant.empty() ? "-" : tenant,
               absl::StrCat(job.shards.size(), "/", job.num_servers,
                            complete ? "" : " INCOMPLETE"),
               absl::StrCat(job.shards.front().job.num_workers()),
               step_min == step_max ? absl::StrCat(step_min)
                                    : absl::StrCat(step_min, "..", step_max),
               missing.empty() ? "-"
                               : absl::StrCat("[", absl::StrJoin(missing, ","),
                                              "]"),
               Bytes(state), checkpoint == 0 ? "-" : absl::StrCat(checkpoint)});
  }
  if (options.json) {
    std::printf("{\"jobs\":[%s],\"unreachable\":%d}\n",
                absl::StrJoin(json, ",").c_str(), unreachable);
  } else {
    table.Print();
  }
  return unreachable > 0 || !all_complete ? kExitDegraded : kExitOk;
}

int Checkpoint(const Fleet& fleet, const std::string& name,
               const CommandOptions& options) {
  absl::StatusOr<FleetJob> job = ResolveJob(fleet, name);
  if (!job.ok()) return NotFound(job.status());
  const ShardCalls<v1::CheckpointResponse> calls = CallShards(
      fleet, *job, v1::CheckpointRequest(), &v1::Depot::Stub::Checkpoint);
  const std::vector<absl::Status>& results = calls.status;
  std::vector<uint64_t> steps;
  for (const v1::CheckpointResponse& r : calls.response) {
    steps.push_back(r.step());
  }
  bool failed = false;
  std::set<uint64_t> distinct;
  std::vector<std::string> json;
  Table table;
  table.Add({"SERVER", "INDEX", "CHECKPOINT"});
  for (size_t k = 0; k < job->shards.size(); ++k) {
    const FleetJob::Shard& shard = job->shards[k];
    const std::string address = fleet.address(shard.server);
    if (!results[k].ok()) {
      failed = true;
      PrintError(results[k]);
    } else {
      distinct.insert(steps[k]);
    }
    json.push_back(absl::StrCat(
        "{\"server\":", JsonString(address),
        ",\"server_index\":", shard.job.server_index(), ",\"step\":",
        results[k].ok() ? absl::StrCat(steps[k]) : "null",
        ",\"error\":", JsonError(results[k]), "}"));
    table.Add({address, absl::StrCat(shard.job.server_index()),
               results[k].ok() ? absl::StrCat("step ", steps[k]) : "FAILED"});
  }
  const bool complete = Complete(*job);
  const bool one_step = !failed && distinct.size() == 1 && complete;
  if (options.json) {
    std::printf(
        "{\"job\":%s,\"step\":%s,\"complete\":%s,\"servers\":[%s]}\n",
        JsonString(job->name).c_str(),
        one_step ? absl::StrCat(*distinct.begin()).c_str() : "null",
        one_step ? "true" : "false", absl::StrJoin(json, ",").c_str());
  } else {
    table.Print();
    if (one_step) {
      std::printf("checkpoint of job \"%s\" at step %llu is complete on all "
                  "%u servers\n",
                  job->name.c_str(),
                  static_cast<unsigned long long>(*distinct.begin()),
                  job->num_servers);
    }
  }
  if (failed) return kExitFailed;
  if (!complete) WarnIncomplete(*job);
  if (distinct.size() > 1) {
    std::fprintf(stderr,
                 "depotctl: the servers checkpointed different steps (the job "
                 "was stepping): no one step is complete from this call; the "
                 "servers' periodic checkpoints, or a call between steps, "
                 "make one\n");
  }
  return one_step ? kExitOk : kExitDegraded;
}

int ListCheckpoints(const Fleet& fleet, const std::string& name, bool verify,
                    const CommandOptions& options) {
  const std::vector<ServerReading> readings = ReadStatus(fleet);
  const int unreachable = CountUnreachable(readings);
  std::vector<FleetJob> jobs;
  if (name.empty()) {
    jobs = GroupJobs(readings, /*own_only=*/true);
  } else {
    absl::StatusOr<FleetJob> job = FindJob(readings, name);
    if (!job.ok()) return NotFound(job.status());
    jobs.push_back(*std::move(job));
  }
  bool failed = false, bad = false, incomplete = unreachable > 0;
  std::vector<std::string> json;
  for (const FleetJob& job : jobs) {
    v1::ListCheckpointsRequest request;
    request.set_verify(verify);
    const ShardCalls<v1::ListCheckpointsResponse> calls = CallShards(
        fleet, job, request, &v1::Depot::Stub::ListCheckpoints);
    const std::vector<absl::Status>& results = calls.status;
    const std::vector<v1::ListCheckpointsResponse>& responses = calls.response;
    const bool complete = Complete(job);
    incomplete = incomplete || !complete;
    if (!complete) WarnIncomplete(job);
    // The steps every server of the job holds (and, verifying, that verify
    // everywhere).
    std::vector<uint64_t> common;
    bool first = true;
    std::vector<std::string> servers;
    if (!options.json) std::printf("job \"%s\":\n", job.name.c_str());
    for (size_t k = 0; k < job.shards.size(); ++k) {
      const std::string address = fleet.address(job.shards[k].server);
      if (!results[k].ok()) {
        failed = true;
        PrintError(results[k]);
        servers.push_back(absl::StrCat("{\"server\":", JsonString(address),
                                       ",\"error\":", JsonError(results[k]),
                                       "}"));
        common.clear();
        first = false;
        continue;
      }
      const v1::ListCheckpointsResponse& r = responses[k];
      std::vector<uint64_t> good;
      std::vector<std::string> verified;
      for (const v1::CheckpointVerification& v : r.verified()) {
        verified.push_back(absl::StrCat(
            "{\"step\":", v.step(), ",\"ok\":", v.ok() ? "true" : "false",
            ",\"error\":", v.ok() ? "null" : JsonString(v.error()), "}"));
        if (v.ok()) {
          good.push_back(v.step());
        } else {
          bad = true;
          std::fprintf(stderr, "depotctl: %s: job \"%s\" step %llu: %s\n",
                       address.c_str(), job.name.c_str(),
                       static_cast<unsigned long long>(v.step()),
                       v.error().c_str());
        }
      }
      const std::vector<uint64_t> steps(r.steps().begin(), r.steps().end());
      // Checkpoints a GPU worker's offload fraction left without its state
      // (docs/checkpoints.md, "The state the workers keep").
      const std::vector<uint64_t> lacking(
          r.steps_lacking_worker_state().begin(),
          r.steps_lacking_worker_state().end());
      const std::vector<uint64_t>& usable = verify ? good : steps;
      if (first) {
        common = usable;
        first = false;
      } else {
        std::vector<uint64_t> both;
        for (const uint64_t step : common) {
          if (std::find(usable.begin(), usable.end(), step) != usable.end()) {
            both.push_back(step);
          }
        }
        common = both;
      }
      servers.push_back(absl::StrCat(
          "{\"server\":", JsonString(address), ",\"server_index\":",
          job.shards[k].job.server_index(), ",\"step\":", r.step(),
          ",\"newest_step\":", r.newest_step(), ",\"steps\":", JsonSteps(steps),
          ",\"steps_lacking_worker_state\":", JsonSteps(lacking),
          verify ? absl::StrCat(",\"verified\":[", absl::StrJoin(verified, ","),
                                "]")
                 : "",
          "}"));
      if (!options.json) {
        std::printf(
            "  %s (server %u, at step %llu): %s%s%s\n", address.c_str(),
            job.shards[k].job.server_index(),
            static_cast<unsigned long long>(r.step()),
            steps.empty()
                ? "no checkpoint"
                : absl::StrCat("steps ", absl::StrJoin(steps, ", ")).c_str(),
            verify ? (good.size() == steps.size()
                          ? " (all verified)"
                          : absl::StrCat(" (", steps.size() - good.size(),
                                         " FAILED to verify)")
                                .c_str())
                   : "",
            lacking.empty()
                ? ""
                : absl::StrCat(" (without the workers' state: steps ",
                               absl::StrJoin(lacking, ", "), ")")
                      .c_str());
      }
    }
    if (!complete) common.clear();
    if (!options.json) {
      std::printf("  complete on every server%s: %s\n",
                  verify ? " and verified" : "",
                  common.empty() ? "none"
                                 : absl::StrJoin(common, ", ").c_str());
    }
    json.push_back(absl::StrCat(
        "{\"name\":", JsonString(job.name),
        ",\"complete\":", complete ? "true" : "false",
        ",\"complete_steps\":", JsonSteps(common), ",\"servers\":[",
        absl::StrJoin(servers, ","), "]}"));
  }
  if (options.json) {
    std::printf("{\"verified\":%s,\"jobs\":[%s],\"unreachable\":%d}\n",
                verify ? "true" : "false", absl::StrJoin(json, ",").c_str(),
                unreachable);
  }
  if (failed) return kExitFailed;
  return bad || incomplete ? kExitDegraded : kExitOk;
}

int RollBack(const Fleet& fleet, const std::string& name, uint64_t step,
             const CommandOptions& options) {
  int exit_code = kExitOk;
  absl::StatusOr<FleetJob> job =
      ResolveWholeJob(fleet, name, "rolling back", &exit_code);
  if (!job.ok()) return exit_code;
  // First every server must be able to go to `step`: at it already, or
  // holding its checkpoint. Nothing changes when one cannot.
  const size_t n = job->shards.size();
  const ShardCalls<v1::ListCheckpointsResponse> lists =
      CallShards(fleet, *job, v1::ListCheckpointsRequest(),
                 &v1::Depot::Stub::ListCheckpoints);
  bool possible = true;
  for (size_t k = 0; k < n; ++k) {
    if (!lists.status[k].ok()) {
      PrintError(lists.status[k]);
      return kExitFailed;
    }
    const v1::ListCheckpointsResponse& r = lists.response[k];
    const bool at_step = r.step() == step && r.newest_step() == step;
    const bool held = std::find(r.steps().begin(), r.steps().end(), step) !=
                      r.steps().end();
    if (!at_step && !held) {
      possible = false;
      std::fprintf(stderr,
                   "depotctl: %s (server %u) can not go to step %llu: it is "
                   "at step %llu and holds checkpoints of steps [%s]\n",
                   fleet.address(job->shards[k].server).c_str(),
                   job->shards[k].job.server_index(),
                   static_cast<unsigned long long>(step),
                   static_cast<unsigned long long>(r.step()),
                   absl::StrJoin(r.steps(), ", ").c_str());
    }
  }
  if (!possible) {
    std::fprintf(stderr,
                 "depotctl: nothing rolled back (`depotctl checkpoints list "
                 "%s` shows the steps every server holds)\n",
                 name.c_str());
    return kExitFailed;
  }
  v1::RollBackRequest request;
  request.set_step(step);
  const ShardCalls<v1::RollBackResponse> calls =
      CallShards(fleet, *job, request, &v1::Depot::Stub::RollBack);
  const std::vector<absl::Status>& results = calls.status;
  const std::vector<v1::RollBackResponse>& rolled = calls.response;
  bool failed = false;
  std::vector<std::string> json;
  Table table;
  table.Add({"SERVER", "INDEX", "RESULT"});
  for (size_t k = 0; k < n; ++k) {
    const std::string address = fleet.address(job->shards[k].server);
    if (!results[k].ok()) {
      failed = true;
      PrintError(results[k]);
    }
    json.push_back(absl::StrCat(
        "{\"server\":", JsonString(address),
        ",\"server_index\":", job->shards[k].job.server_index(),
        ",\"ok\":", results[k].ok() ? "true" : "false",
        ",\"restored\":", rolled[k].restored() ? "true" : "false",
        ",\"dropped_contributions\":", rolled[k].dropped_contributions(),
        ",\"error\":", JsonError(results[k]), "}"));
    table.Add({address, absl::StrCat(job->shards[k].job.server_index()),
               !results[k].ok()     ? "FAILED"
               : rolled[k].restored() ? "restored from its checkpoint"
                                      : "already at the step"});
  }
  if (options.json) {
    std::printf("{\"job\":%s,\"step\":%llu,\"ok\":%s,\"servers\":[%s]}\n",
                JsonString(job->name).c_str(),
                static_cast<unsigned long long>(step),
                failed ? "false" : "true", absl::StrJoin(json, ",").c_str());
  } else {
    table.Print();
    bool changed = false;
    for (const v1::RollBackResponse& r : rolled) {
      changed = changed || r.restored() || r.dropped_contributions() > 0;
    }
    if (!failed && changed) {
      std::printf(
          "job \"%s\" is at step %llu on every server; its trainers get "
          "RolledBackError (step %llu) at their next step\n",
          job->name.c_str(), static_cast<unsigned long long>(step),
          static_cast<unsigned long long>(step));
    } else if (!failed) {
      std::printf("job \"%s\" was at step %llu on every server already\n",
                  job->name.c_str(), static_cast<unsigned long long>(step));
    } else {
      std::fprintf(stderr,
                   "depotctl: the servers may now disagree: run the same "
                   "rollback again\n");
    }
  }
  return failed ? kExitFailed : kExitOk;
}

int Import(const Fleet& fleet, const std::string& name, uint64_t step,
           const std::vector<std::string>& dirs,
           const CommandOptions& options) {
  int exit_code = kExitOk;
  absl::StatusOr<FleetJob> job =
      ResolveWholeJob(fleet, name, "importing", &exit_code);
  if (!job.ok()) return exit_code;
  // Servers whose shard holds no chunk have nothing to read.
  std::vector<size_t> shards;
  for (size_t k = 0; k < job->shards.size(); ++k) {
    if (job->shards[k].job.shard_params() > 0) shards.push_back(k);
  }
  auto with_chunks = [](const FleetJob::Shard& shard) {
    return shard.job.shard_params() > 0;
  };
  std::vector<absl::Status> results;
  std::vector<v1::ImportCheckpointResponse> imported;
  auto call_all = [&](bool verify_only) {
    v1::ImportCheckpointRequest request;
    request.set_step(step);
    for (const std::string& dir : dirs) request.add_checkpoint_dirs(dir);
    request.set_verify_only(verify_only);
    ShardCalls<v1::ImportCheckpointResponse> calls =
        CallShards(fleet, *job, request, &v1::Depot::Stub::ImportCheckpoint,
                   with_chunks);
    results = std::move(calls.status);
    imported = std::move(calls.response);
    bool ok = true;
    for (const size_t k : shards) {
      if (!results[k].ok()) {
        ok = false;
        PrintError(results[k]);
      }
    }
    return ok;
  };
  // Every server checks its part before any imports.
  if (!call_all(/*verify_only=*/true)) {
    std::fprintf(stderr, "depotctl: nothing imported\n");
    return kExitFailed;
  }
  const bool ok = call_all(/*verify_only=*/false);
  std::vector<std::string> json;
  for (const size_t k : shards) {
    const FleetJob::Shard& shard = job->shards[k];
    std::vector<std::string> files;
    for (const std::string& file : imported[k].shard_files()) {
      files.push_back(JsonString(file));
    }
    json.push_back(absl::StrCat(
        "{\"server\":", JsonString(fleet.address(shard.server)),
        ",\"server_index\":", shard.job.server_index(),
        ",\"ok\":", results[k].ok() ? "true" : "false",
        ",\"old_num_servers\":", imported[k].old_num_servers(),
        ",\"shard_files\":[", absl::StrJoin(files, ","),
        "],\"error\":", JsonError(results[k]), "}"));
    if (!options.json && results[k].ok()) {
      std::printf("%s (server %u): step %llu from %d file(s) of %u old servers\n",
                  fleet.address(shard.server).c_str(),
                  shard.job.server_index(),
                  static_cast<unsigned long long>(imported[k].step()),
                  imported[k].shard_files_size(),
                  imported[k].old_num_servers());
    }
  }
  if (options.json) {
    std::printf("{\"job\":%s,\"step\":%llu,\"ok\":%s,\"servers\":[%s]}\n",
                JsonString(job->name).c_str(),
                static_cast<unsigned long long>(step), ok ? "true" : "false",
                absl::StrJoin(json, ",").c_str());
  } else if (ok) {
    std::printf("job \"%s\" is at step %llu on every server\n",
                job->name.c_str(), static_cast<unsigned long long>(step));
  } else {
    std::fprintf(stderr,
                 "depotctl: the import failed on some servers after all "
                 "verified: run it again\n");
  }
  return ok ? kExitOk : kExitFailed;
}

int Drain(const Fleet& fleet, bool shutdown, bool resume,
          const CommandOptions& options) {
  v1::DrainRequest request;
  request.set_shutdown(shutdown);
  request.set_resume(resume);
  v1::DrainResponse response;
  std::unique_ptr<grpc::ClientContext> context = fleet.NewContext();
  const absl::Status status = WithServer(
      FromGrpcStatus(fleet.stub(0).Drain(context.get(), request, &response)),
      fleet.address(0));
  if (!status.ok()) {
    PrintError(status);
    return kExitFailed;
  }
  bool failed = false;
  std::vector<std::string> json;
  for (const v1::DrainedJob& job : response.checkpoints()) {
    failed = failed || !job.error().empty();
    json.push_back(absl::StrCat(
        "{\"job_id\":", job.job_id(), ",\"name\":", JsonString(job.name()),
        ",\"tenant\":", JsonString(job.tenant()),
        ",\"step\":", job.error().empty() ? absl::StrCat(job.step()) : "null",
        ",\"error\":", job.error().empty() ? "null" : JsonString(job.error()),
        "}"));
    if (!job.error().empty()) {
      std::fprintf(stderr, "depotctl: %s: job \"%s\"%s not checkpointed: %s\n",
                   fleet.address(0).c_str(), job.name().c_str(),
                   OfTenant(job.tenant()).c_str(), job.error().c_str());
    }
  }
  if (options.json) {
    std::printf(
        "{\"server\":%s,\"draining\":%s,\"shutting_down\":%s,"
        "\"checkpoints\":[%s]}\n",
        JsonString(fleet.address(0)).c_str(),
        response.draining() ? "true" : "false",
        response.shutting_down() ? "true" : "false",
        absl::StrJoin(json, ",").c_str());
  } else if (resume) {
    std::printf("%s takes new jobs again (SERVING)\n",
                fleet.address(0).c_str());
  } else {
    for (const v1::DrainedJob& job : response.checkpoints()) {
      if (job.error().empty()) {
        std::printf("checkpointed job \"%s\"%s at step %llu\n",
                    job.name().c_str(), OfTenant(job.tenant()).c_str(),
                    static_cast<unsigned long long>(job.step()));
      }
    }
    std::printf("%s is drained: no new jobs, NOT_SERVING%s\n",
                fleet.address(0).c_str(),
                response.shutting_down() ? "; it is shutting down" : "");
  }
  if (shutdown && !response.shutting_down()) {
    std::fprintf(stderr,
                 "depotctl: %s was NOT shut down: a job's checkpoint failed "
                 "(stopping it would lose that job's steps since its last "
                 "checkpoint)\n",
                 fleet.address(0).c_str());
  }
  return failed ? kExitFailed : kExitOk;
}

int Delete(const Fleet& fleet, const std::string& name, bool confirmed,
           const CommandOptions& options) {
  absl::StatusOr<FleetJob> job = ResolveJob(fleet, name);
  if (!job.ok()) return NotFound(job.status());
  if (!confirmed) {
    std::fprintf(stderr,
                 "depotctl: would delete job \"%s\" (its state, on %zu "
                 "server(s)); its checkpoints go with it. Run again with --yes "
                 "to delete it\n",
                 job->name.c_str(), job->shards.size());
    return kExitUsage;
  }
  const size_t n = job->shards.size();
  const std::vector<absl::Status> results =
      CallShards(fleet, *job, v1::DeleteJobRequest(),
                 &v1::Depot::Stub::DeleteJob)
          .status;
  bool failed = false;
  std::vector<std::string> json;
  for (size_t k = 0; k < n; ++k) {
    if (!results[k].ok()) {
      failed = true;
      PrintError(results[k]);
    }
    json.push_back(absl::StrCat(
        "{\"server\":", JsonString(fleet.address(job->shards[k].server)),
        ",\"job_id\":", job->shards[k].job.job_id(),
        ",\"ok\":", results[k].ok() ? "true" : "false",
        ",\"error\":", JsonError(results[k]), "}"));
  }
  if (options.json) {
    std::printf("{\"job\":%s,\"ok\":%s,\"servers\":[%s]}\n",
                JsonString(job->name).c_str(), failed ? "false" : "true",
                absl::StrJoin(json, ",").c_str());
  } else if (!failed) {
    std::printf("deleted job \"%s\" on %zu server(s)\n", job->name.c_str(), n);
  }
  if (!failed && !Complete(*job)) {
    WarnIncomplete(*job);
    return kExitDegraded;
  }
  return failed ? kExitFailed : kExitOk;
}

}  // namespace depot::ctl

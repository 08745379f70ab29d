#include "plan/parallelism_check.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "plan/job_plan.h"
#include "schedule/schedule.h"

namespace trainyard {
namespace {

using trainyard::v1::JobSpec;
using trainyard::v1::ParallelismSpec;

void SetDefaults(ParallelismSpec* par) {
  if (par->stages() == 0) par->set_stages(1);
  if (par->microbatches() == 0) par->set_microbatches(1);
  if (par->schedule().empty()) par->set_schedule("1f1b");
  if (par->chunks() == 0) par->set_chunks(DefaultChunks(par->schedule()));
  if (par->replicas() == 0) par->set_replicas(1);
  if (par->accumulation().empty()) {
    par->set_accumulation(par->replicas() > 1 ? "tree" : "sequential");
  }
}

// At least one stage, and no more than blocks.
bool CheckStages(const ParallelismSpec& par, int num_blocks, Problems* p) {
  if (par.stages() < 1) {
    p->Add("parallelism.stages",
           absl::StrCat("must be >= 1, got ", par.stages()));
    return false;
  }
  if (num_blocks > 0 && par.stages() > num_blocks) {
    p->Add("parallelism.stages",
           absl::StrCat("must be <= the number of blocks (", num_blocks,
                        "), got ", par.stages()));
    return false;
  }
  return true;
}

// A known schedule with a chunk count it takes and, when the stages are
// valid (`stages_ok`), no more virtual stages than blocks.
bool CheckScheduleAndChunks(const ParallelismSpec& par, int num_blocks,
                            bool stages_ok, Problems* p) {
  if (!CheckOneOf(p, "parallelism.schedule", par.schedule(),
                  {"gpipe", "1f1b", "zbh1", "interleaved", "zbv"})) {
    return false;
  }
  const std::string& name = par.schedule();
  const int v = par.chunks();
  const bool chunks_ok = name == "interleaved" ? v >= 2
                         : name == "zbv"       ? v == 2
                                               : v == 1;
  if (!chunks_ok) {
    p->Add(
        "parallelism.chunks",
        absl::StrCat("schedule ", Quote(name),
                     name == "interleaved" ? " takes 2 or more chunks per stage"
                     : name == "zbv"       ? " takes exactly 2 chunks per stage"
                                           : " takes 1 chunk per stage (only "
                                             "\"interleaved\" and \"zbv\" take "
                                             "more)",
                     ", got ", v));
    return false;
  }
  if (stages_ok && num_blocks > 0 && int64_t{par.stages()} * v > num_blocks) {
    p->Add("parallelism.chunks",
           absl::StrCat("stages x chunks (", par.stages(), " x ", v,
                        " virtual stages) must be <= the number of blocks (",
                        num_blocks, ")"));
    return false;
  }
  return true;
}

void CheckMicrobatches(const ParallelismSpec& par, int64_t batch_size,
                       Problems* p) {
  if (par.microbatches() < 1) {
    p->Add("parallelism.microbatches",
           absl::StrCat("must be >= 1, got ", par.microbatches()));
  } else if (batch_size > 0 && par.microbatches() > batch_size) {
    p->Add("parallelism.microbatches",
           absl::StrCat("must be <= data.batch_size (", batch_size, "), got ",
                        par.microbatches()));
  }
}

// The replica count, and what more than one replica needs: a power-of-two
// share of microbatches, no in-memory snapshots, tree accumulation.
void CheckReplicas(const JobSpec& s, Problems* p) {
  const ParallelismSpec& par = s.parallelism();
  if (par.replicas() < 1 || par.replicas() > kMaxReplicas) {
    p->Add("parallelism.replicas", absl::StrCat("must be in [1, ", kMaxReplicas,
                                                "], got ", par.replicas()));
    return;
  }
  // A forward-only job's replicas take whole batches each (engine/
  // inference.h): none of what follows applies.
  if (par.replicas() == 1 || s.kind() != "train") return;
  const int r = par.replicas();
  const int m = par.microbatches();
  if (m < r || m % r != 0 || ((m / r) & (m / r - 1)) != 0) {
    p->Add("parallelism.replicas",
           absl::StrCat("parallelism.microbatches / replicas must be a power "
                        "of two (each replica's share one block of the "
                        "summation tree), got ",
                        m, " / ", r));
  }
  if (s.recovery().snapshot_every() > 0) {
    p->Add("recovery.snapshot_every",
           absl::StrCat("must be 0 with replicas > 1 (in-memory snapshots "
                        "follow one pipeline; replicated jobs restart from "
                        "checkpoints), got ",
                        s.recovery().snapshot_every()));
  }
  if (par.accumulation() != "tree") {
    p->Add("parallelism.accumulation",
           absl::StrCat("must be \"tree\" with replicas > 1 (the replicas' "
                        "sums must follow one order), got ",
                        Quote(par.accumulation())));
  }
}

// Each replica's microbatches against the schedule: whole groups of S under
// "interleaved", and a schedule small enough for every worker to build.
void CheckMicrobatchesPerReplica(const ParallelismSpec& par, Problems* p) {
  const int per_replica = par.microbatches() / par.replicas();
  if (par.schedule() == "interleaved" && per_replica % par.stages() != 0) {
    p->Add("parallelism.microbatches",
           absl::StrCat("schedule \"interleaved\" runs microbatches in "
                        "groups of one per stage: microbatches per replica "
                        "must be a multiple of stages (",
                        par.stages(), "), got ", per_replica));
  }
  const int64_t passes = int64_t{par.stages()} * par.chunks() * per_replica;
  if (passes > kMaxScheduledPasses) {
    p->Add("parallelism.microbatches",
           absl::StrCat("stages x chunks x microbatches per replica must be "
                        "<= ",
                        kMaxScheduledPasses,
                        " (the schedule every worker "
                        "builds), got ",
                        passes));
  }
}

// An explicit split: one entry >= 1 per virtual stage (checked when the
// stages are valid), summing to the block count.
bool CheckSplit(const ParallelismSpec& par, int num_blocks, bool stages_ok,
                Problems* p) {
  if (par.split_size() == 0) return true;
  bool split_ok = true;
  const int64_t virtual_stages = int64_t{par.stages()} * par.chunks();
  if (stages_ok && par.split_size() != virtual_stages) {
    p->Add("parallelism.split",
           par.chunks() == 1
               ? absl::StrCat("must have one entry per stage (", par.stages(),
                              "), got ", par.split_size())
               : absl::StrCat("must have one entry per virtual stage (",
                              par.stages(), " stages x ", par.chunks(),
                              " chunks = ", virtual_stages, "), got ",
                              par.split_size()));
    split_ok = false;
  }
  int64_t total = 0;
  for (int i = 0; i < par.split_size(); ++i) {
    if (par.split(i) < 1) {
      p->Add(absl::StrCat("parallelism.split[", i, "]"),
             absl::StrCat("must be >= 1, got ", par.split(i)));
      split_ok = false;
    }
    total += par.split(i);
  }
  if (split_ok && num_blocks > 0 && total != num_blocks) {
    p->Add("parallelism.split",
           absl::StrCat("must sum to the number of blocks (", num_blocks,
                        "), got ", total));
    split_ok = false;
  }
  return split_ok;
}

}  // namespace

bool CheckParallelism(Problems* p, JobSpec* spec) {
  ParallelismSpec* par = spec->mutable_parallelism();
  SetDefaults(par);
  const int num_blocks = spec->model().blocks_size();
  bool stages_ok = CheckStages(*par, num_blocks, p);
  stages_ok =
      CheckScheduleAndChunks(*par, num_blocks, stages_ok, p) && stages_ok;
  CheckMicrobatches(*par, spec->data().batch_size(), p);
  CheckOneOf(p, "parallelism.accumulation", par->accumulation(),
             {"sequential", "tree"});
  CheckReplicas(*spec, p);
  if (spec->kind() == "train" && stages_ok && par->microbatches() >= 1 &&
      par->replicas() >= 1) {
    CheckMicrobatchesPerReplica(*par, p);
  }
  const bool split_ok = CheckSplit(*par, num_blocks, stages_ok, p);
  return stages_ok && split_ok;
}

}  // namespace trainyard

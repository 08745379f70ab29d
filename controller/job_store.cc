#include "controller/job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

using v1::Job;
using v1::JobEvent;

constexpr char kJobColumns[] =
    "seq, job_id, request_id, spec, state, reason, priority, create_time_ms, "
    "start_time_ms, end_time_ms, steps_completed, last_step, last_eval, "
    "workers, recovery, owner";

// One prepared statement; finalized on destruction.
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& sql) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()),
                      SQLITE_TRANSIENT);
  }
  void BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()),
                      SQLITE_TRANSIENT);
  }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return sqlite3_step(stmt_); }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(static_cast<const char*>(p), n);
  }
  sqlite3_stmt* get() { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

absl::Status ReadJob(Stmt& s, Job* job, int64_t* seq) {
  if (seq != nullptr) *seq = s.Int(0);
  job->set_job_id(s.Text(1));
  job->set_owner(s.Text(15));
  // The column holds RequestKey(owner, request_id).
  job->set_request_id(std::string(absl::StripPrefix(
      s.Text(2), job->owner().empty() ? "" : job->owner() + ":")));
  if (!job->mutable_spec()->ParseFromString(s.Text(3))) {
    return absl::DataLossError(
        absl::StrCat("job ", job->job_id(), ": stored spec does not parse"));
  }
  job->set_state(static_cast<v1::JobState>(s.Int(4)));
  job->set_reason(s.Text(5));
  job->set_priority(static_cast<int32_t>(s.Int(6)));
  job->set_create_time_ms(s.Int(7));
  job->set_start_time_ms(s.Int(8));
  job->set_end_time_ms(s.Int(9));
  job->set_steps_completed(s.Int(10));
  std::string last_step = s.Text(11);
  std::string last_eval = s.Text(12);
  if (!last_step.empty()) job->mutable_last_step()->ParseFromString(last_step);
  if (!last_eval.empty()) job->mutable_last_eval()->ParseFromString(last_eval);
  std::string workers = s.Text(13);
  if (!workers.empty()) {
    for (absl::string_view w : absl::StrSplit(workers, ',')) {
      job->add_workers(std::string(w));
    }
  }
  // The restart count and reasons, as a Job holding only those fields.
  std::string recovery = s.Text(14);
  if (!recovery.empty()) {
    Job r;
    if (!r.ParseFromString(recovery)) {
      return absl::DataLossError(absl::StrCat(
          "job ", job->job_id(), ": stored restart history does not parse"));
    }
    job->set_restarts(r.restarts());
    *job->mutable_restart_reasons() = r.restart_reasons();
    if (r.has_progress()) *job->mutable_progress() = r.progress();
  }
  return absl::OkStatus();
}

std::string RecoveryBlob(const Job& job) {
  if (job.restarts() == 0 && job.restart_reasons_size() == 0 &&
      !job.has_progress()) {
    return "";
  }
  Job r;
  r.set_restarts(job.restarts());
  *r.mutable_restart_reasons() = job.restart_reasons();
  if (job.has_progress()) *r.mutable_progress() = job.progress();
  return r.SerializeAsString();
}

std::string SerializeOrEmpty(const google::protobuf::Message& m, bool has) {
  return has ? m.SerializeAsString() : std::string();
}

}  // namespace

std::string RequestKey(const std::string& owner,
                       const std::string& request_id) {
  return owner.empty() ? request_id : absl::StrCat(owner, ":", request_id);
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(
    const std::string& data_dir) {
  if (data_dir.empty()) {
    return absl::InvalidArgumentError("data_dir: required");
  }
  if (mkdir(data_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create data dir ", data_dir, ": ", std::strerror(errno)));
  }
  std::string path = data_dir + "/controller.db";
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
      nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open job database ", path, ": ", msg));
  }
  std::unique_ptr<JobStore> store(new JobStore(db, path));
  absl::MutexLock lock(&store->mu_);
  RETURN_IF_ERROR(store->Init());
  return store;
}

JobStore::~JobStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close(db_);
}

absl::Status JobStore::Error(const std::string& what) {
  return absl::InternalError(
      absl::StrCat(path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status JobStore::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(
        absl::StrCat(path_, ": ", msg, " (in: ", sql, ")"));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Init() {
  sqlite3_busy_timeout(db_, 5000);
  RETURN_IF_ERROR(Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(Exec("PRAGMA synchronous=NORMAL"));
  RETURN_IF_ERROR(
      Exec("CREATE TABLE IF NOT EXISTS jobs ("
           " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
           " job_id TEXT NOT NULL UNIQUE,"
           " request_id TEXT NOT NULL UNIQUE,"
           " spec BLOB NOT NULL,"
           " state INTEGER NOT NULL,"
           " reason TEXT NOT NULL DEFAULT '',"
           " priority INTEGER NOT NULL DEFAULT 0,"
           " create_time_ms INTEGER NOT NULL DEFAULT 0,"
           " start_time_ms INTEGER NOT NULL DEFAULT 0,"
           " end_time_ms INTEGER NOT NULL DEFAULT 0,"
           " steps_completed INTEGER NOT NULL DEFAULT 0,"
           " last_step BLOB,"
           " last_eval BLOB,"
           " workers TEXT NOT NULL DEFAULT '',"
           " recovery BLOB,"
           " owner TEXT NOT NULL DEFAULT '');"
           "CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, seq);"
           "CREATE TABLE IF NOT EXISTS job_events ("
           " job_id TEXT NOT NULL,"
           " seq INTEGER NOT NULL,"
           " event BLOB NOT NULL,"
           " PRIMARY KEY (job_id, seq)) WITHOUT ROWID;"));
  // A database from an older controller gains the columns added since.
  std::set<std::string> columns;
  {
    Stmt s(db_, "SELECT name FROM pragma_table_info('jobs')");
    if (!s.ok()) return Error("read the jobs table's columns");
    while (s.Step() == SQLITE_ROW) columns.insert(s.Text(0));
  }
  if (columns.count("recovery") == 0) {
    RETURN_IF_ERROR(Exec("ALTER TABLE jobs ADD COLUMN recovery BLOB"));
  }
  if (columns.count("owner") == 0) {
    RETURN_IF_ERROR(
        Exec("ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT ''"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobStore::Created> JobStore::CreateJob(const Job& job) {
  absl::MutexLock lock(&mu_);
  if (job.request_id().empty()) {
    return absl::InvalidArgumentError("request_id: required");
  }
  {
    Stmt s(db_, absl::StrCat("SELECT ", kJobColumns,
                             " FROM jobs WHERE request_id = ?"));
    s.Bind(1, RequestKey(job.owner(), job.request_id()));
    int rc = s.Step();
    if (rc == SQLITE_ROW) {
      Created existing;
      RETURN_IF_ERROR(ReadJob(s, &existing.job, nullptr));
      return existing;
    }
    if (rc != SQLITE_DONE) return Error("look up request_id");
  }
  return InsertJob(job);
}

absl::StatusOr<JobStore::Created> JobStore::InsertJob(const Job& job) {
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto fail = [&](const std::string& what) {
    absl::Status st = Error(what);
    Exec("ROLLBACK").IgnoreError();
    return st;
  };
  int64_t seq = 0;
  {
    Stmt s(db_,
           "INSERT INTO jobs (job_id, request_id, spec, state, reason, "
           "priority, create_time_ms, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
    const std::string key = RequestKey(job.owner(), job.request_id());
    s.Bind(1, "pending:" + key);
    s.Bind(2, key);
    s.BindBlob(3, job.spec().SerializeAsString());
    s.Bind(4, static_cast<int64_t>(v1::QUEUED));
    s.Bind(5, job.reason());
    s.Bind(6, static_cast<int64_t>(job.priority()));
    s.Bind(7, job.create_time_ms());
    s.Bind(8, job.owner());
    if (s.Step() != SQLITE_DONE) return fail("insert job");
    seq = sqlite3_last_insert_rowid(db_);
  }
  Created created;
  created.created = true;
  created.job = job;
  created.job.set_job_id(absl::StrCat("job-", seq));
  created.job.set_state(v1::QUEUED);
  {
    Stmt s(db_, "UPDATE jobs SET job_id = ? WHERE seq = ?");
    s.Bind(1, created.job.job_id());
    s.Bind(2, seq);
    if (s.Step() != SQLITE_DONE) return fail("name job");
  }
  {
    JobEvent event;
    event.set_job_id(created.job.job_id());
    event.mutable_state()->set_state(v1::QUEUED);
    event.mutable_state()->set_reason(job.reason());
    Stmt s(db_, "INSERT INTO job_events (job_id, seq, event) VALUES (?, 0, ?)");
    s.Bind(1, created.job.job_id());
    s.BindBlob(2, event.SerializeAsString());
    if (s.Step() != SQLITE_DONE) return fail("append first event");
  }
  RETURN_IF_ERROR(Commit());
  return created;
}

absl::Status JobStore::UpdateJob(const Job& job, int64_t event_seq,
                                 const JobEvent* event) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto fail = [&](absl::Status st) {
    Exec("ROLLBACK").IgnoreError();
    return st;
  };
  {
    Stmt s(db_,
           "UPDATE jobs SET state = ?, reason = ?, start_time_ms = ?, "
           "end_time_ms = ?, steps_completed = ?, last_step = ?, "
           "last_eval = ?, workers = ?, recovery = ? WHERE job_id = ?");
    s.Bind(1, static_cast<int64_t>(job.state()));
    s.Bind(2, job.reason());
    s.Bind(3, job.start_time_ms());
    s.Bind(4, job.end_time_ms());
    s.Bind(5, job.steps_completed());
    s.BindBlob(6, SerializeOrEmpty(job.last_step(), job.has_last_step()));
    s.BindBlob(7, SerializeOrEmpty(job.last_eval(), job.has_last_eval()));
    s.Bind(8, absl::StrJoin(job.workers(), ","));
    s.BindBlob(9, RecoveryBlob(job));
    s.Bind(10, job.job_id());
    if (s.Step() != SQLITE_DONE) return fail(Error("update job"));
    if (sqlite3_changes(db_) == 0) {
      return fail(absl::NotFoundError(
          absl::StrCat("job ", job.job_id(), ": not found")));
    }
  }
  if (event != nullptr) {
    Stmt s(db_, "INSERT INTO job_events (job_id, seq, event) VALUES (?, ?, ?)");
    s.Bind(1, job.job_id());
    s.Bind(2, event_seq);
    s.BindBlob(3, event->SerializeAsString());
    if (s.Step() != SQLITE_DONE) {
      return fail(Error(
          absl::StrCat("append event ", event_seq, " of job ", job.job_id())));
    }
  }
  return Commit();
}

absl::StatusOr<Job> JobStore::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt s(db_,
         absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE job_id = ?"));
  s.Bind(1, job_id);
  int rc = s.Step();
  if (rc == SQLITE_DONE) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, ": not found"));
  }
  if (rc != SQLITE_ROW) return Error("get job");
  Job job;
  RETURN_IF_ERROR(ReadJob(s, &job, nullptr));
  return job;
}

absl::StatusOr<std::vector<Job>> JobStore::LoadJobs() {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, absl::StrCat("SELECT ", kJobColumns, " FROM jobs ORDER BY seq"));
  std::vector<Job> jobs;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    Job job;
    RETURN_IF_ERROR(ReadJob(s, &job, nullptr));
    jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return Error("load jobs");
  return jobs;
}

absl::StatusOr<int64_t> JobStore::NextEventSeq(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT MAX(seq) FROM job_events WHERE job_id = ?");
  s.Bind(1, job_id);
  if (s.Step() != SQLITE_ROW) return Error("next event seq");
  // MAX over no rows is NULL, which reads as 0: tell them apart.
  if (sqlite3_column_type(s.get(), 0) == SQLITE_NULL) return 0;
  return s.Int(0) + 1;
}

absl::StatusOr<std::vector<JobEvent>> JobStore::LoadEvents(
    const std::string& job_id, int64_t from, int64_t count) {
  absl::MutexLock lock(&mu_);
  Stmt s(db_,
         "SELECT seq, event FROM job_events WHERE job_id = ? AND seq >= ? "
         "AND seq < ? ORDER BY seq");
  s.Bind(1, job_id);
  s.Bind(2, from);
  s.Bind(3, from + count);
  std::vector<JobEvent> events(std::max<int64_t>(count, 0));
  int64_t next = from;
  int rc;
  // Keep every event that can be read: a gap (a write that failed) or an
  // unreadable row must not cost the rest of a job's history.
  auto missing = [&](int64_t end) {
    if (end > next) {
      LOG(WARNING) << "job " << job_id << ": events " << next << ".." << end - 1
                   << " are missing from the store";
    }
  };
  while ((rc = s.Step()) == SQLITE_ROW) {
    const int64_t seq = s.Int(0);
    missing(seq);
    next = seq + 1;
    if (!events[seq - from].ParseFromString(s.Text(1))) {
      LOG(WARNING) << "job " << job_id << ": event " << seq
                   << " does not parse; skipped";
      events[seq - from].Clear();
    }
  }
  if (rc != SQLITE_DONE) return Error("load events");
  missing(from + count);
  return events;
}

absl::Status JobStore::Commit() {
  absl::Status st = Exec("COMMIT");
  // A failed COMMIT leaves the transaction open; close it, or every later
  // BEGIN IMMEDIATE fails.
  if (!st.ok()) Exec("ROLLBACK").IgnoreError();
  return st;
}

absl::StatusOr<std::vector<Job>> JobStore::ListJobs(
    const std::vector<v1::JobState>& states, const std::string* owner,
    int limit, int64_t before, int64_t* next_before) {
  absl::MutexLock lock(&mu_);
  std::string sql = absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE 1");
  if (owner != nullptr) absl::StrAppend(&sql, " AND owner = ?");
  if (before > 0) absl::StrAppend(&sql, " AND seq < ", before);
  if (!states.empty()) {
    std::vector<std::string> parts;
    for (v1::JobState st : states) parts.push_back(absl::StrCat(int{st}));
    absl::StrAppend(&sql, " AND state IN (", absl::StrJoin(parts, ","), ")");
  }
  absl::StrAppend(&sql, " ORDER BY seq DESC LIMIT ", limit + 1);
  Stmt s(db_, sql);
  if (!s.ok()) return Error("list jobs");
  if (owner != nullptr) s.Bind(1, *owner);
  std::vector<Job> jobs;
  *next_before = 0;
  int rc;
  int64_t last_seq = 0;
  while ((rc = s.Step()) == SQLITE_ROW) {
    if (static_cast<int>(jobs.size()) == limit) {
      *next_before = last_seq;
      break;
    }
    Job job;
    RETURN_IF_ERROR(ReadJob(s, &job, &last_seq));
    jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("list jobs");
  return jobs;
}

}  // namespace trainyard

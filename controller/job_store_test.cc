#include "controller/job_store.h"

#include <stdlib.h>

#include <string>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

std::string TempDir() {
  std::string tmpl =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
      "/job_store_XXXXXX";
  char* dir = mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl + "/data";  // Open creates it
}

v1::Job NewJob(const std::string& request_id, int priority = 0) {
  v1::Job job;
  job.set_request_id(request_id);
  job.mutable_spec()->set_name("spec-" + request_id);
  job.mutable_spec()->set_steps(10);
  job.set_priority(priority);
  job.set_create_time_ms(1000);
  return job;
}

TEST(JobStoreTest, CreateIsIdempotentPerRequestId) {
  auto store = JobStore::Open(TempDir());
  ASSERT_TRUE(store.ok()) << store.status();
  auto a = (*store)->CreateJob(NewJob("r1"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->created);
  EXPECT_EQ(a->job.state(), v1::QUEUED);
  auto b = (*store)->CreateJob(NewJob("r1"));
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->created);
  EXPECT_EQ(b->job.job_id(), a->job.job_id());
  auto c = (*store)->CreateJob(NewJob("r2"));
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->job.job_id(), a->job.job_id());
  EXPECT_EQ((*store)->LoadJobs()->size(), 2u);
}

TEST(JobStoreTest, JobsAndEventsSurviveReopen) {
  const std::string dir = TempDir();
  std::string id;
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    auto created = (*store)->CreateJob(NewJob("r1", 3));
    ASSERT_TRUE(created.ok());
    v1::Job job = created->job;
    id = job.job_id();
    job.set_state(v1::SUCCEEDED);
    job.set_reason("done");
    job.set_steps_completed(2);
    job.add_workers("w-1");
    job.add_workers("w-2");
    job.mutable_last_step()->set_step(2);
    job.mutable_last_step()->set_loss(0.5);
    v1::JobEvent step;
    step.mutable_step()->set_step(1);
    step.mutable_step()->set_loss(0.75);
    ASSERT_TRUE((*store)->UpdateJob(job, 1, &step).ok());
    v1::JobEvent done;
    done.mutable_state()->set_state(v1::SUCCEEDED);
    ASSERT_TRUE((*store)->UpdateJob(job, 2, &done).ok());
  }
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto job = (*store)->GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  EXPECT_EQ(job->reason(), "done");
  EXPECT_EQ(job->priority(), 3);
  EXPECT_EQ(job->spec().name(), "spec-r1");
  EXPECT_EQ(job->steps_completed(), 2);
  EXPECT_DOUBLE_EQ(job->last_step().loss(), 0.5);
  ASSERT_EQ(job->workers_size(), 2);
  EXPECT_EQ(job->workers(1), "w-2");
  EXPECT_EQ(*(*store)->NextEventSeq(id), 3);
  auto events = (*store)->LoadEvents(id, 0, 3);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[0].state().state(), v1::QUEUED);
  EXPECT_DOUBLE_EQ((*events)[1].step().loss(), 0.75);
  EXPECT_EQ((*events)[2].state().state(), v1::SUCCEEDED);
}

TEST(JobStoreTest, HistoryWithAGapKeepsTheRestAndTheNextSeq) {
  auto store = JobStore::Open(TempDir());
  ASSERT_TRUE(store.ok());
  v1::Job job = (*store)->CreateJob(NewJob("gap"))->job;  // event 0
  v1::JobEvent step;
  step.mutable_step()->set_step(1);
  // Event 1 "failed to write": the next stored one is 2.
  ASSERT_TRUE((*store)->UpdateJob(job, 2, &step).ok());
  EXPECT_EQ(*(*store)->NextEventSeq(job.job_id()), 3);
  // Element i is event i: the missing ones (1, and 3 past the end) empty.
  auto events = (*store)->LoadEvents(job.job_id(), 0, 4);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 4u);
  EXPECT_TRUE((*events)[0].has_state());
  EXPECT_EQ((*events)[1].event_case(), v1::JobEvent::EVENT_NOT_SET);
  EXPECT_EQ((*events)[2].step().step(), 1);
  EXPECT_EQ((*events)[3].event_case(), v1::JobEvent::EVENT_NOT_SET);
  events = (*store)->LoadEvents(job.job_id(), 2, 1);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].step().step(), 1);
  EXPECT_EQ(*(*store)->NextEventSeq("job-404"), 0);
}

TEST(JobStoreTest, ReopenLoadsJobsAsTheyWere) {
  const std::string dir = TempDir();
  std::string running_id, queued_id;
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok());
    v1::Job running = (*store)->CreateJob(NewJob("run"))->job;
    running_id = running.job_id();
    running.set_state(v1::RUNNING);
    running.set_restarts(1);
    running.add_restart_reasons("worker w-2 lost");
    running.add_workers("w-1");
    running.add_workers("w-3");
    v1::JobEvent ev;
    ev.mutable_state()->set_state(v1::RUNNING);
    ASSERT_TRUE((*store)->UpdateJob(running, 1, &ev).ok());
    queued_id = (*store)->CreateJob(NewJob("queued"))->job.job_id();
  }
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  auto running = (*store)->GetJob(running_id);
  ASSERT_TRUE(running.ok());
  // The controller, not the store, decides what becomes of a running job
  // (it re-adopts it from its workers).
  EXPECT_EQ(running->state(), v1::RUNNING);
  EXPECT_EQ(running->end_time_ms(), 0);
  EXPECT_EQ(running->restarts(), 1);
  ASSERT_EQ(running->restart_reasons_size(), 1);
  EXPECT_EQ(running->restart_reasons(0), "worker w-2 lost");
  EXPECT_EQ(running->workers_size(), 2);
  auto events = (*store)->LoadEvents(running_id, 0, 2);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ(events->back().state().state(), v1::RUNNING);
  EXPECT_EQ((*store)->GetJob(queued_id)->state(), v1::QUEUED);
}

TEST(JobStoreTest, ListNewestFirstWithFilterAndPaging) {
  auto store = JobStore::Open(TempDir());
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 5; ++i) {
    v1::Job job = (*store)->CreateJob(NewJob("r" + std::to_string(i)))->job;
    if (i % 2 == 1) {
      job.set_state(v1::CANCELLED);
      ASSERT_TRUE((*store)->UpdateJob(job, 0, nullptr).ok());
    }
  }
  int64_t next = 0;
  auto page = (*store)->ListJobs({}, nullptr, 2, 0, &next);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].request_id(), "r4");
  EXPECT_EQ((*page)[1].request_id(), "r3");
  ASSERT_GT(next, 0);
  page = (*store)->ListJobs({}, nullptr, 2, next, &next);
  EXPECT_EQ((*page)[0].request_id(), "r2");
  page = (*store)->ListJobs({}, nullptr, 2, next, &next);
  ASSERT_EQ(page->size(), 1u);
  EXPECT_EQ(next, 0);
  page = (*store)->ListJobs({v1::CANCELLED}, nullptr, 10, 0, &next);
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].request_id(), "r3");
  EXPECT_EQ((*page)[1].request_id(), "r1");
}

TEST(JobStoreTest, MissingJobIsNotFound) {
  auto store = JobStore::Open(TempDir());
  ASSERT_TRUE(store.ok());
  auto job = (*store)->GetJob("job-99");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(job.status().message().find("job-99"), std::string::npos);
}

TEST(JobStoreTest, UnwritableDataDirIsAnError) {
  auto store = JobStore::Open("/proc/no/such/dir");
  EXPECT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("/proc/no/such/dir"),
            std::string::npos);
}

}  // namespace
}  // namespace trainyard

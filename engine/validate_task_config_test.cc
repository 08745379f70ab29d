// ValidateTaskConfig: a config checked by the plugin's validate_config
// without a task, as the controller does at submit; and that checking holds
// no file or mapping.
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/task_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "task_plugins/plugin_test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using testing::PluginDir;
using ::testing::StartsWith;
using testing::TestdataPluginDir;

TEST(ValidateTaskConfigTest, ValidConfigIsValid) {
  for (const std::string config : {"", "{}", R"({"reduction": "mean"})"}) {
    auto r = ValidateTaskConfig(PluginDir(), "mse", config);
    ASSERT_TRUE(r.ok()) << config << ": " << r.status();
    EXPECT_EQ(*r, ConfigCheck::kValid) << config;
  }
}

TEST(ValidateTaskConfigTest, RefusedConfigIsInvalidArgumentUnderTaskConfig) {
  auto r = ValidateTaskConfig(PluginDir(), "mse",
                              R"({"reduction": "mean", "typo": 1})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "task.config: unknown key \"typo\" (allowed: reduction)");
}

TEST(ValidateTaskConfigTest, MessageNamingNoFieldIsPrefixed) {
  auto r = ValidateTaskConfig(TestdataPluginDir(), "misbehaving",
                              R"({"mode": "validate_refuse"})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "task.config: refused on purpose (mode \"validate_refuse\")");
  // The same plugin accepts its working modes.
  auto ok = ValidateTaskConfig(TestdataPluginDir(), "misbehaving",
                               R"({"mode": "ok"})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, ConfigCheck::kValid);
}

TEST(ValidateTaskConfigTest, RefusalWithoutMessageNamesThePlugin) {
  auto r = ValidateTaskConfig(TestdataPluginDir(), "misbehaving",
                              R"({"mode": "validate_silent"})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "task.config: refused by plugin \"misbehaving\" without a "
            "message");
}

TEST(ValidateTaskConfigTest, LongMessageIsCutToOneKiBOnACharacterBoundary) {
  auto r = ValidateTaskConfig(TestdataPluginDir(), "misbehaving",
                              R"({"mode": "validate_long"})");
  ASSERT_FALSE(r.ok());
  const absl::string_view m = r.status().message();
  EXPECT_LE(m.size(), 1024u);
  EXPECT_GT(m.size(), 1000u);
  ASSERT_TRUE(absl::StartsWith(m, "task.config: \xc3\xa9"));
  // Whole two-byte characters only: after the 13-byte prefix, an even count.
  EXPECT_EQ((m.size() - 13) % 2, 0u) << m.size();
  EXPECT_EQ(m.substr(m.size() - 2), "\xc3\xa9");
}

TEST(ValidateTaskConfigTest, ExceptionIsInternal) {
  auto r = ValidateTaskConfig(TestdataPluginDir(), "misbehaving",
                              R"({"mode": "validate_throw"})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(r.status().message(),
            "plugin \"misbehaving\": validate_config: threw a C++ exception "
            "across the ABI: validate_config thrown on purpose");
}

TEST(ValidateTaskConfigTest, PluginWithoutValidateConfigIsNotChecked) {
  for (const char* name : {"old_layout", "sdk_without_context"}) {
    auto r = ValidateTaskConfig(TestdataPluginDir(), name,
                                R"({"path": "/anything"})");
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_EQ(*r, ConfigCheck::kNotChecked) << name;
  }
}

TEST(ValidateTaskConfigTest, LoadsOnlyWhatLoadWould) {
  auto bad_name = ValidateTaskConfig(PluginDir(), "../mse", "{}");
  ASSERT_FALSE(bad_name.ok());
  EXPECT_EQ(bad_name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_name.status().message(),
            "plugin \"../mse\": invalid plugin name: must match "
            "[A-Za-z0-9_]+");
  auto no_symbol = ValidateTaskConfig(TestdataPluginDir(), "no_symbol", "{}");
  ASSERT_FALSE(no_symbol.ok());
  EXPECT_EQ(no_symbol.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(no_symbol.status().message()),
              HasSubstr("not a Trainyard task plugin; it was not loaded"));
  EXPECT_EQ(getenv("TRAINYARD_NO_SYMBOL_LOADED"), nullptr);
  auto missing = ValidateTaskConfig(PluginDir(), "xent", "{}");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

int CountEntries(const std::string& dir) {
  int n = 0;
  for (DIR* d = opendir(dir.c_str()); d != nullptr;) {
    if (readdir(d) == nullptr) {
      closedir(d);
      break;
    }
    ++n;
  }
  return n;
}

int CountMappingsOf(const std::string& file) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find(file) != std::string::npos;
  }
  return n;
}

TEST(ValidateTaskConfigTest, RepeatedCallsHoldNoFilesOrMappings) {
  const std::string dir = TestdataPluginDir();
  ASSERT_TRUE(ValidateTaskConfig(dir, "misbehaving", "{}").ok());
  const int fds = CountEntries("/proc/self/fd");
  const int maps = CountMappingsOf("libmisbehaving.so");
  EXPECT_GT(maps, 0);
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(ValidateTaskConfig(dir, "misbehaving", "{}").ok());
  }
  EXPECT_EQ(CountEntries("/proc/self/fd"), fds);
  EXPECT_EQ(CountMappingsOf("libmisbehaving.so"), maps);
}

// --- Create with a data folder ----------------------------------------------

}  // namespace
}  // namespace trainyard

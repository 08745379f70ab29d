#include "core/file_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

TEST(FileUtilTest, AtomicWriteReplacesAndReadsBack) {
  std::string path = JoinPath(TmpDir(), "atomic.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, std::string("sec\0ond", 7)).ok());
  auto got = ReadFileToString(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("sec\0ond", 7));
  EXPECT_EQ(*FileSize(path), 7);
}

TEST(FileUtilTest, AtomicWriteIntoMissingFolderFailsAndLeavesNothing) {
  std::string path = JoinPath(TmpDir(), "no_such_dir/x.txt");
  absl::Status s = WriteFileAtomically(path, "data");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no_such_dir"));
}

TEST(FileUtilTest, FailedWriteKeepsOldFile) {
  // A read-only folder makes creating the temp file fail (unless we run as
  // root, where permissions do not apply; then the check is vacuous).
  std::string dir = JoinPath(TmpDir(), "ro");
  ASSERT_TRUE(CreateDirectories(dir).ok());
  std::string path = JoinPath(dir, "keep.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  ::chmod(dir.c_str(), 0555);
  absl::Status s = WriteFileAtomically(path, "new");
  ::chmod(dir.c_str(), 0755);
  if (!s.ok()) {
    EXPECT_THAT(s.message(), HasSubstr("keep.txt"));
    EXPECT_EQ(*ReadFileToString(path), "old");
  }
}

TEST(FileUtilTest, ReadMissingIsNotFoundNamingPath) {
  std::string path = JoinPath(TmpDir(), "missing.bin");
  auto got = ReadFileToString(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr(path));
  EXPECT_EQ(FileSize(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(FileUtilTest, CreateDirectoriesNested) {
  std::string dir = JoinPath(TmpDir(), "a/b/c");
  ASSERT_TRUE(CreateDirectories(dir).ok());
  ASSERT_TRUE(CreateDirectories(dir).ok());  // idempotent
  struct stat st;
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  std::string file = JoinPath(TmpDir(), "plain");
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  EXPECT_THAT(CreateDirectories(JoinPath(file, "sub")).message(),
              HasSubstr("not a folder"));
}

TEST(FileUtilTest, PathHelpers) {
  EXPECT_EQ(Dirname("a/b/c"), "a/b");
  EXPECT_EQ(Dirname("c"), ".");
  EXPECT_EQ(Dirname("/c"), "/");
  EXPECT_EQ(Dirname("a/b/"), "a");
  EXPECT_EQ(JoinPath("a/", "/b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(JoinPath("/", "b"), "/b");
}

TEST(FileUtilTest, CleanAbsolutePathCollapsesDotsAndStaysAtRoot) {
  EXPECT_EQ(CleanAbsolutePath("/a//b/./c/../d"), "/a/b/d");
  EXPECT_EQ(CleanAbsolutePath("/a/../../.."), "/");
  EXPECT_EQ(CleanAbsolutePath("/"), "/");
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_EQ(CleanAbsolutePath("x/./y"),
            CleanAbsolutePath(std::string(cwd)) + "/x/y");
}

TEST(FileUtilTest, ResolveSymlinksFollowsLinksAndRefusesDanglingOnes) {
  const std::string dir = CleanAbsolutePath(TmpDir() + "/resolve");
  ASSERT_TRUE(CreateDirectories(dir + "/real/sub").ok());
  ::unlink((dir + "/link").c_str());
  ::unlink((dir + "/dangling").c_str());
  ASSERT_EQ(::symlink((dir + "/real").c_str(), (dir + "/link").c_str()), 0);
  ASSERT_EQ(::symlink((dir + "/nowhere").c_str(), (dir + "/dangling").c_str()),
            0);
  absl::StatusOr<std::string> real = ResolveSymlinks(dir + "/link/sub/new/f");
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_EQ(*real, *ResolveSymlinks(dir) + "/real/sub/new/f");
  absl::StatusOr<std::string> bad = ResolveSymlinks(dir + "/dangling/f");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("does not resolve"));
  EXPECT_TRUE(PathIsInside("/data/x", "/data"));
  EXPECT_TRUE(PathIsInside("/data", "/data"));
  EXPECT_FALSE(PathIsInside("/database", "/data"));
  EXPECT_TRUE(PathIsInside("/anything", "/"));
}

}  // namespace
}  // namespace trainyard

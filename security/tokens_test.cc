#include "security/tokens.h"

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "core/sha256.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

std::string TempPath(const std::string& name) {
  return JoinPath(::testing::TempDir(), name);
}

TEST(TokensTest, KnownTokenIsItsUserAndRole) {
  const std::string path = TempPath("tokens_known");
  const std::string alice = NewToken(), ops = NewToken();
  ASSERT_TRUE(absl::StartsWith(alice, "ty_"));
  EXPECT_EQ(alice.size(), 3u + 64u);
  EXPECT_NE(alice, ops);
  ASSERT_TRUE(WriteFileAtomically(path, "# comment\n\n").ok());
  ASSERT_TRUE(AppendToken(path, "alice", Role::kUser, alice).ok());
  ASSERT_TRUE(AppendToken(path, "ops", Role::kAdmin, ops).ok());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(absl::StrContains(*text, alice)) << "only hashes are stored";

  auto table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  auto a = (*table)->Authenticate("Bearer " + alice);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->user, "alice");
  EXPECT_FALSE(a->admin);
  auto o = (*table)->Authenticate("Bearer " + ops);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->user, "ops");
  EXPECT_TRUE(o->admin);
}

TEST(TokensTest, AppendAfterAHandEditWithoutTrailingNewline) {
  const std::string path = TempPath("tokens_no_newline");
  const std::string first = NewToken(), second = NewToken();
  std::string line = *TokensFileLine("first", Role::kUser, first);
  line.pop_back();  // as an editor might leave it
  ASSERT_TRUE(WriteFileAtomically(path, line).ok());
  ASSERT_TRUE(AppendToken(path, "second", Role::kUser, second).ok());
  auto table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*table)->Authenticate("Bearer " + first)->user, "first");
  EXPECT_EQ((*table)->Authenticate("Bearer " + second)->user, "second");
}

TEST(TokensTest, RefusalsAreUnauthenticatedAndSayWhatToDo) {
  const std::string path = TempPath("tokens_refusals");
  const std::string token = NewToken();
  ASSERT_TRUE(AppendToken(path, "bob", Role::kUser, token).ok());
  auto table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok());
  for (const std::string& header :
       {std::string(""), std::string("Basic Ym9iOnB3"),
        std::string("Bearer ty_0000"), "Bearer " + token + "x"}) {
    auto r = (*table)->Authenticate(header);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << header;
    EXPECT_TRUE(absl::StrContains(r.status().message(), "TRAINYARD_TOKEN"))
        << r.status();
    EXPECT_FALSE(absl::StrContains(r.status().message(), token));
  }
}

TEST(TokensTest, MalformedLinesNameTheLineNotTheSecret) {
  const std::string path = TempPath("tokens_bad");
  const std::string hash = Sha256Hex("t");
  for (const auto& [text, want] :
       std::vector<std::pair<std::string, std::string>>{
           {"alice user\n", ":1: expected 3 fields"},
           {"# x\nalice root sha256:" + hash + "\n", ":2: role must be"},
           {"al ice user sha256:" + hash + "\n", ":1: expected 3 fields"},
           {"al/ice user sha256:" + hash + "\n", ":1: user names"},
           {"alice user " + hash + "\n", ":1: the third field"},
           {"a user sha256:" + hash + "\nb user sha256:" + hash + "\n",
            ":2: the same token hash"}}) {
    ASSERT_TRUE(WriteFileAtomically(path, text).ok());
    auto table = TokenTable::Load(path);
    ASSERT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
    EXPECT_TRUE(absl::StrContains(table.status().message(), path + want))
        << table.status();
    EXPECT_FALSE(absl::StrContains(table.status().message(), hash));
  }
  EXPECT_EQ(TokenTable::Load(TempPath("no_such_tokens")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(TokensFileLine("a b", Role::kUser, "t").ok());
}

TEST(TokensTest, ReloadsWhenTheFileChangesAndKeepsTheLastGoodTable) {
  const std::string path = TempPath("tokens_reload");
  const std::string first = NewToken(), second = NewToken();
  ASSERT_TRUE(
      WriteFileAtomically(path, *TokensFileLine("first", Role::kUser, first))
          .ok());
  auto table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok());
  ASSERT_TRUE((*table)->Authenticate("Bearer " + first).ok());
  // Revoke `first`, add `second`.
  ASSERT_TRUE(
      WriteFileAtomically(path, *TokensFileLine("second", Role::kAdmin, second))
          .ok());
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_EQ((*table)->Authenticate("Bearer " + first).status().code(),
            absl::StatusCode::kUnauthenticated);
  auto s = (*table)->Authenticate("Bearer " + second);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->admin);
  // A broken edit keeps the last good table.
  ASSERT_TRUE(WriteFileAtomically(path, "garbage line here now\n").ok());
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_TRUE((*table)->Authenticate("Bearer " + second).ok());
}

}  // namespace
}  // namespace trainyard

#include "cli/connect.h"

#include <stdlib.h>

#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cli/cli_flags.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

// Clears the variables connect.h reads, so that each test sets its own.
class ConnectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"TRAINYARD_CONTROLLER", "TRAINYARD_TOKEN",
                             "TRAINYARD_TOKEN_FILE", "TRAINYARD_CA"}) {
      unsetenv(name);
    }
  }

  // Writes `text` to a file under the test's temporary folder.
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + "/" + name;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    return path;
  }
};

TEST_F(ConnectTest, ControllerAddressFlagThenEnvironmentThenDefault) {
  CliFlags flags;
  EXPECT_EQ(ControllerAddress(flags), "127.0.0.1:7070");
  setenv("TRAINYARD_CONTROLLER", "", 1);
  EXPECT_EQ(ControllerAddress(flags), "127.0.0.1:7070");
  setenv("TRAINYARD_CONTROLLER", "ctl:1", 1);
  EXPECT_EQ(ControllerAddress(flags), "ctl:1");
  flags.controller = "flag:2";
  EXPECT_EQ(ControllerAddress(flags), "flag:2");
}

TEST_F(ConnectTest, TokenFromFileFlagBeforeEnvironment) {
  CliFlags flags;
  absl::StatusOr<std::string> none = TokenFromFlags(flags);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, "");

  setenv("TRAINYARD_TOKEN", " env-token\n", 1);
  EXPECT_EQ(*TokenFromFlags(flags), "env-token");

  flags.token_file = WriteFile("token", "  file-token \n");
  EXPECT_EQ(*TokenFromFlags(flags), "file-token");
}

TEST_F(ConnectTest, TokenFileVariableWhenNoToken) {
  CliFlags flags;
  setenv("TRAINYARD_TOKEN_FILE", WriteFile("env_token", "t1\n").c_str(), 1);
  EXPECT_EQ(*TokenFromFlags(flags), "t1");

  setenv("TRAINYARD_TOKEN_FILE", "/nonexistent/token", 1);
  absl::StatusOr<std::string> missing = TokenFromFlags(flags);
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_NE(missing.status().message().find(
                "$TRAINYARD_TOKEN_FILE /nonexistent/token: "),
            std::string::npos)
      << missing.status();
}

TEST_F(ConnectTest, TokenFileTooLargeIsNotAToken) {
  CliFlags flags;
  flags.token_file = WriteFile("big", std::string(4097, 'x'));
  absl::StatusOr<std::string> big = TokenFromFlags(flags);
  EXPECT_TRUE(absl::IsInvalidArgument(big.status()));
  EXPECT_EQ(big.status().message(),
            "--token_file " + flags.token_file + ": 4097 bytes; not a token");
}

TEST_F(ConnectTest, SecurityReadsNoTokenOverPlaintext) {
  CliFlags flags;
  flags.token_file = "/nonexistent/token";
  flags.tls_ca = "ca.pem";
  flags.tls_server_name = "name";
  EXPECT_TRUE(absl::IsInvalidArgument(SecurityFromFlags(flags).status()));

  flags.insecure = true;
  absl::StatusOr<JobClientSecurity> plain = SecurityFromFlags(flags);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->tls.insecure);
  EXPECT_EQ(plain->tls.ca_file, "");
  EXPECT_EQ(plain->tls.server_name, "");
  EXPECT_EQ(plain->token, "");
}

TEST_F(ConnectTest, SecurityCaFlagThenEnvironment) {
  CliFlags flags;
  setenv("TRAINYARD_CA", "env-ca.pem", 1);
  setenv("TRAINYARD_TOKEN", "tok", 1);
  absl::StatusOr<JobClientSecurity> env = SecurityFromFlags(flags);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_FALSE(env->tls.insecure);
  EXPECT_EQ(env->tls.ca_file, "env-ca.pem");
  EXPECT_EQ(env->token, "tok");

  flags.tls_ca = "flag-ca.pem";
  EXPECT_EQ(SecurityFromFlags(flags)->tls.ca_file, "flag-ca.pem");
}

TEST_F(ConnectTest, ReconnectWindowAtLeastOneSecond) {
  CliFlags flags;
  flags.reconnect_s = 0;
  EXPECT_EQ(ReconnectWindow(flags), absl::Seconds(1));
  flags.reconnect_s = 30;
  EXPECT_EQ(ReconnectWindow(flags), absl::Seconds(30));
}

}  // namespace
}  // namespace trainyard

// exec_children: children that are fresh processes running one hidden test of this executable.
#include <catch2/catch.hpp>

#include "integration/exec_child.hpp"

using namespace troupe;

TEST_CASE("an exec'd child runs its hidden test with its rank and the parent's environment", "[integration][spawn]") {
  auto kids = troupe::test::exec_children(2, "child: checks its rank and environment", {{"TROUPE_TEST_WORD", "tensor"}});
  CHECK(kids.join(std::chrono::seconds(60)));
}

TEST_CASE("an exec'd child whose hidden test fails makes join name its rank", "[integration][spawn]") {
  auto kids = troupe::test::exec_children(1, "child: fails one assertion", {}, true);
  try {
    kids.join(std::chrono::seconds(60));
    FAIL("join succeeded although the child's test failed");
  } catch (const error& e) {
    CHECK(e.code() == errc::peer_lost);
    CHECK_THAT(e.message(), Catch::Contains("rank 0"));
  }
}

TEST_CASE("child: checks its rank and environment", "[.]") {
  const int r = troupe::test::child_rank();
  if (r == 0) return;
  REQUIRE((r == 1 || r == 2));
  REQUIRE(troupe::test::child_env("TROUPE_TEST_WORD") == "tensor");
  REQUIRE_THROWS_AS(troupe::test::child_env("TROUPE_TEST_ABSENT"), error);
}

TEST_CASE("child: fails one assertion", "[.]") {
  if (troupe::test::child_rank() == 0) return;
  CHECK(1 == 2);
}

// The main() of hspmd's Catch2 unit-test executables.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

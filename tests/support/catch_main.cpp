// The main() of hspmd's Catch2 unit-test executables (Catch2 itself: catch_impl.cpp).
#include "run_catch.hpp"

int main(int argc, char** argv) {
  return hspmd::test::run_catch(argc, argv);
}

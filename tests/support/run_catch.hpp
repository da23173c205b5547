#pragma once
// Runs the Catch2 session of a test executable on `argv` (its command line); returns its exit
// code. Defined once, with Catch2's implementation, in catch_impl.cpp.

namespace hspmd::test {

int run_catch(int argc, const char* const* argv);

} // namespace hspmd::test

#!/usr/bin/env bash
# The public API of the published crates (mooncake-sys, mooncake) against
# the last release tag (v*), with cargo-semver-checks: a change that breaks
# semver without the matching version bump fails. Before the first tag there
# is nothing to compare and it says so.
#   scripts/semver-check.sh            # build the tool if needed, then check
#   scripts/semver-check.sh --install  # only build the tool (CI starts it early)
# cargo-semver-checks is built once into target/tools (a debug build: it
# compiles in far less time and checks two small crates quickly); building
# it, and the scratch projects it resolves, need crates.io.
set -euo pipefail
cd "$(dirname "$0")/.."
tool_version=0.51.0
# The newest release tag behind HEAD, not on HEAD itself: a release commit
# is compared with the release before it.
tag=$(git tag --merged HEAD --no-contains HEAD -l 'v[0-9]*' --sort=-v:refname | head -n 1)
if [ -z "$tag" ]; then
  if git tag --points-at HEAD -l 'v[0-9]*' | grep -q .; then
    echo "semver-check: HEAD is the first release: nothing before it to compare against"
  else
    echo "semver-check: SKIPPED: no release tag (v*) reachable from HEAD (a clone without tags?)"
  fi
  exit 0
fi
tools=$PWD/target/tools
if ! "$tools/bin/cargo-semver-checks" semver-checks --version 2>/dev/null | grep -q "$tool_version"; then
  echo "semver-check: building cargo-semver-checks $tool_version into target/tools"
  CARGO_PROFILE_DEV_DEBUG=0 CARGO_TARGET_DIR="$tools/build" \
    cargo install -q --locked --debug --root "$tools" "cargo-semver-checks@$tool_version"
fi
[ "${1:-}" = --install ] && exit 0
export PATH="$tools/bin:$PATH"
# DOCS_RS: the engine's build script compiles nothing (rustdoc only reads
# the crates' items); both the tag and this tree honour it.
echo "semver-check: mooncake-sys and mooncake against $tag"
DOCS_RS=1 cargo semver-checks -p mooncake-sys --baseline-rev "$tag" --only-explicit-features --features cuda13
DOCS_RS=1 cargo semver-checks -p mooncake --baseline-rev "$tag" --only-explicit-features --features cuda13,cudarc

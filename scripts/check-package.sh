#!/usr/bin/env bash
# Packages the published crates as crates.io would (with verification,
# offline), then proves the packages stand alone: a new project outside the
# workspace depends on the unpacked `.crate` files only, builds the engine
# from the sources inside mooncake-sys's package, and moves bytes between two
# engines on 127.0.0.1.
#   scripts/check-package.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# The packages must build from their own sources, never the workspace's.
unset MOONCAKE_VENDOR_DIR
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
# Verification unpacks each package from a local registry into cargo's
# registry/src/-<hash>/ and reuses an unpacked copy of the same version: drop
# the copies of earlier runs, or a changed crate is verified against the old
# sources of its dependency.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/mooncake-sys-"$version" \
  "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/mooncake-"$version"
# --allow-dirty: a developer checks the tree they have, committed or not.
# The connector (the root package) is `publish = false`: it never reaches
# crates.io, and verifying its package would build it and all its
# dependencies once more for nothing.
cargo package --workspace --exclude mooncake-connector --offline --locked --allow-dirty -q
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for crate in mooncake-sys mooncake; do
  tar -xzf "target/package/$crate-$version.crate" -C "$work"
done
# Nothing but the packages: no link back into the workspace may be left.
if [ -n "$(find "$work" -type l -print -quit)" ]; then
  echo "check-package: the packages contain symbolic links" >&2; exit 1
fi
mkdir -p "$work/user/src"
cat > "$work/user/Cargo.toml" <<TOML
[package]
name = "package-user"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
mooncake = "$version"

# Stand-ins for crates.io: the unpacked packages, nothing from the workspace.
[patch.crates-io]
mooncake = { path = "../mooncake-$version" }
mooncake-sys = { path = "../mooncake-sys-$version" }
TOML
cat > "$work/user/src/main.rs" <<'RS'
use mooncake::{Access, Engine, HostBuffer};

fn main() -> mooncake::Result<()> {
    let target = Engine::builder().local_host("127.0.0.1").build()?;
    let initiator = Engine::builder().local_host("127.0.0.1").build()?;
    let mut buf = HostBuffer::new(1 << 20)?;
    buf.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
    let _published = target.register(buf, "*", Access::RemoteAccessible)?;
    let local = initiator.register(HostBuffer::new(1 << 16)?, "*", Access::LocalOnly)?;
    let segment = initiator.open_segment(target.segment_name())?;
    let remote = segment.buffers()?[0];
    let mut batch = initiator.batch(1)?;
    batch.read(&local, 0, &segment, remote.addr + 4096, 1 << 16)?;
    batch.submit()?;
    batch.wait(None)?;
    drop(batch);
    let ok = local.to_vec().iter().enumerate().all(|(i, b)| *b == ((i + 4096) % 251) as u8);
    assert!(ok, "the bytes read differ from the target's");
    println!("package-user: 64 KiB read from a second engine and checked");
    Ok(())
}
RS
# The workspace's lock file pins the same dependency versions (offline);
# its target directory saves recompiling them, not mooncake-sys.
cp Cargo.lock "$work/user/"
(cd "$work/user" && CARGO_TARGET_DIR="$root/target/package-user" cargo run -q --offline)
echo "check-package: mooncake-sys and mooncake $version package, verify, and build and run from the .crate files alone"

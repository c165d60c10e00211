//! Builds the vendored C++ engine with the `cc` crate (a C++17 compiler and
//! pthreads are all it needs: no cmake, no libclang) and links it statically.
//!
//! Environment (each read once, logged, and tracked for rebuilds):
//! - `MOONCAKE_VENDOR_DIR`: engine sources (default: `vendor/` next to this
//!   file: in the repository a link to the workspace's `vendor/`, in the
//!   published crate a copy that `cargo package` made through that link).
//! - `DOCS_RS`: set by docs.rs, which builds documentation only: the engine
//!   is neither compiled nor linked and no CUDA toolkit is looked for.
//! - `MOONCAKE_SYS_WERROR=1`: treat C++ warnings as errors (CI sets it).
//! - `MOONCAKE_SYS_OPT_LEVEL`: optimisation of the engine (default 2, even in
//!   debug builds, so tests exercise a realistically fast engine).
//! - `MOONCAKE_CUDA_HOME`: the CUDA toolkit (or PyPI runtime directory) for
//!   the `cuda12`/`cuda13` features; see `cuda.rs` for the search order.
use std::path::{Path, PathBuf};

/// Reads an environment variable, logs it and asks cargo to rerun when it
/// changes.
fn env(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    let v = std::env::var(name).ok();
    eprintln!("mooncake-sys: {name} = {v:?}");
    v
}

fn collect_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("mooncake-sys: cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("mooncake-sys: directory entry").path();
        if path.is_dir() {
            collect_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "cpp") {
            out.push(path);
        }
    }
}

mod cuda;

fn main() {
    let (include, src) = locate_vendor();
    // First: every path below reruns on a changed header or source,
    // including the DOCS_RS exit (the bindings check runs there).
    let sources = track_sources(&include, &src);
    // Before the DOCS_RS exit: the bindings check needs them, not the engine.
    #[cfg(feature = "bindgen")]
    generate_bindings(&include);
    if env("DOCS_RS").is_some() {
        // Documentation needs the crate's items, not the engine: docs.rs
        // has no network and no CUDA, and links nothing. The GPU items are
        // documented for the CUDA major the features ask for.
        let major = match cuda::wanted() {
            Some(cuda::Want::Major(m)) => m,
            Some(cuda::Want::Either) => 13,
            None => 0,
        };
        emit_metadata(&include, major, 0);
        return;
    }
    check_target_os();
    let mut build = engine_build(&include, &src, &sources);
    let toolkit = cuda::wanted()
        .map(|want| cuda::find(want, &|k: &str| env(k)).unwrap_or_else(|msg| panic!("{msg}")));
    if let Some(tk) = &toolkit {
        build
            .define("MC_WITH_CUDA", "1")
            .define("MC_CUDA_MAJOR", tk.major().to_string().as_str())
            .include(&tk.include);
    }
    build.compile("mooncake_engine");
    if let Some(tk) = &toolkit {
        link_cuda_runtime(tk);
    }
    println!("cargo:rustc-link-lib=pthread");
    // dlopen/dlsym: the RDMA transport loads libibverbs at run time (and GPU
    // builds libcuda). In libc since glibc 2.34, in libdl before.
    println!("cargo:rustc-link-lib=dl");
    emit_metadata(
        &include,
        toolkit.as_ref().map_or(0, |t| t.major()),
        toolkit.as_ref().map_or(0, |t| t.version),
    );
}

/// The engine's `include/` and `src/` directories (`MOONCAKE_VENDOR_DIR`,
/// else `vendor/` in this crate); panics with a hint when they are not there.
fn locate_vendor() -> (PathBuf, PathBuf) {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let vendor = env("MOONCAKE_VENDOR_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("vendor"));
    let include = vendor.join("include");
    let src = vendor.join("src");
    if !include.join("transfer_engine_c.h").is_file() || !src.is_dir() {
        panic!(
            "mooncake-sys: the engine sources were not found at {} (a checkout without \
             symbolic links? mooncake-sys/vendor links to ../vendor); set MOONCAKE_VENDOR_DIR to \
             the directory that holds include/transfer_engine_c.h and src/.",
            vendor.display()
        );
    }
    (include, src)
}

/// Every `.cpp` under `src`, sorted; cargo reruns when any of them, or the
/// headers, change.
fn track_sources(include: &Path, src: &Path) -> Vec<PathBuf> {
    println!("cargo:rerun-if-changed={}", include.display());
    println!("cargo:rerun-if-changed={}", src.display());
    let mut sources = Vec::new();
    collect_sources(src, &mut sources);
    sources.sort();
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
    }
    sources
}

fn check_target_os() {
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "linux" {
        panic!("mooncake-sys: the engine supports Linux only (target os: {target_os})");
    }
}

/// The C++17 build of the engine, before any CUDA settings
/// (`MOONCAKE_SYS_OPT_LEVEL`, `MOONCAKE_SYS_WERROR`).
fn engine_build(include: &Path, src: &Path, sources: &[PathBuf]) -> cc::Build {
    let opt = env("MOONCAKE_SYS_OPT_LEVEL").unwrap_or_else(|| "2".into());
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .include(include)
        .include(src)
        .files(sources)
        .opt_level_str(&opt)
        .flag("-pthread")
        .flag_if_supported("-fvisibility=hidden")
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-Wno-missing-field-initializers");
    if env("MOONCAKE_SYS_WERROR").as_deref() == Some("1") {
        build.warnings_into_errors(true);
    }
    build
}

/// The runtime, statically: nothing but libcuda.so.1 is needed at run time
/// (the runtime loads it itself), so there is no libcudart.so.N to go
/// missing.
fn link_cuda_runtime(tk: &cuda::Toolkit) {
    // A runtime upgraded in place rebuilds the engine against it.
    println!(
        "cargo:rerun-if-changed={}",
        tk.include.join("cuda.h").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        tk.lib.join("libcudart_static.a").display()
    );
    println!("cargo:rustc-link-search=native={}", tk.lib.display());
    println!("cargo:rustc-link-lib=static=cudart_static");
    println!("cargo:rustc-link-lib=rt");
    println!(
        "cargo:warning=mooncake-sys: CUDA {} from {} ({})",
        tk.version_string(),
        tk.root.display(),
        tk.found_by
    );
}

/// The CUDA version compiled in and the engine version, for this crate
/// (`rustc-env`) and for dependents (`DEP_MOONCAKE_ENGINE_*`).
/// `major` and `version` are 0 for a CPU-only engine.
fn emit_metadata(include: &Path, major: u32, version: u32) {
    println!("cargo:cuda_major={major}");
    println!("cargo:cuda_version={version}");
    println!("cargo:rustc-env=MOONCAKE_CUDA_MAJOR={major}");

    // Metadata for dependents (DEP_MOONCAKE_ENGINE_*).
    println!("cargo:include={}", include.display());
    let engine = engine_version(include);
    println!("cargo:version={engine}");
    println!("cargo:rustc-env=MOONCAKE_ENGINE_VERSION={engine}");
}

/// Reads MC_ENGINE_VERSION from the extension header.
fn engine_version(include: &Path) -> String {
    let header = std::fs::read_to_string(include.join("mooncake_ext.h")).expect("mooncake_ext.h");
    header
        .lines()
        .find_map(|l| l.strip_prefix("#define MC_ENGINE_VERSION "))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("MC_ENGINE_VERSION in mooncake_ext.h")
}

#[cfg(feature = "bindgen")]
fn generate_bindings(include: &Path) {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("bindings.rs");
    let bindings = bindgen::Builder::default()
        .header(include.join("mooncake_ext.h").to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_file(".*/transfer_engine_c\\.h")
        .allowlist_file(".*/mooncake_ext\\.h")
        .use_core()
        .layout_tests(true)
        .derive_default(true)
        .generate_comments(false)
        .merge_extern_blocks(true)
        .sort_semantically(true)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "mooncake-sys: bindgen failed ({e}). The `bindgen` feature needs libclang \
                 (Debian: apt-get install libclang-dev); without the feature the committed \
                 bindings are used."
            )
        });
    bindings.write_to_file(&out).expect("write bindings");
}

//! Finding the CUDA toolkit for the `cuda12` / `cuda13` features.
//!
//! Search order (the first directory that has the headers and
//! `libcudart_static.a` is used):
//! 1. `MOONCAKE_CUDA_HOME` (ours; an explicit choice of the wrong major is an
//!    error, not skipped)
//! 2. `CUDA_HOME`, `CUDA_PATH`
//! 3. `/usr/local/cuda-<major>*` (newest first), then `/usr/local/cuda`
//! 4. the PyPI runtime packages in Python's site-packages (and
//!    `$VIRTUAL_ENV`): `nvidia/cuda_runtime` from `nvidia-cuda-runtime-cu12`
//!    (12.x) and `nvidia/cu13` from `nvidia-cuda-runtime` (13.x).
//! 5. the same packages where the workspace's
//!    `scripts/install-cuda-runtimes.sh` puts them (`.cuda/cu12`,
//!    `.cuda/cu13` at the workspace root), so a checkout builds the CUDA
//!    features with no variable set.
//!
//! The version comes from `CUDA_VERSION` in `cuda.h`; a toolkit of the other
//! major is refused with a message that names the feature, what was found
//! and the variable to set.
use std::path::{Path, PathBuf};

/// Which majors the enabled features accept.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Want {
    Major(u32),
    Either,
}

impl Want {
    fn accepts(self, major: u32) -> bool {
        match self {
            Want::Major(m) => m == major,
            Want::Either => major == 12 || major == 13,
        }
    }
    fn describe(self) -> String {
        match self {
            Want::Major(m) => format!("feature `cuda{m}` needs a CUDA {m} toolkit"),
            Want::Either => {
                "features `cuda12` and `cuda13` together need a CUDA 12 or 13 toolkit".into()
            }
        }
    }
}

pub fn wanted() -> Option<Want> {
    match (cfg!(feature = "cuda12"), cfg!(feature = "cuda13")) {
        (false, false) => None,
        (true, false) => Some(Want::Major(12)),
        (false, true) => Some(Want::Major(13)),
        (true, true) => Some(Want::Either),
    }
}

pub struct Toolkit {
    pub root: PathBuf,
    pub include: PathBuf,
    pub lib: PathBuf,
    pub version: u32,
    pub found_by: String,
}

impl Toolkit {
    pub fn major(&self) -> u32 {
        self.version / 1000
    }
    pub fn version_string(&self) -> String {
        format!("{}.{}", self.version / 1000, (self.version % 1000) / 10)
    }
}

/// `CUDA_VERSION` from `<include>/cuda.h`.
fn header_version(include: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(include.join("cuda.h")).ok()?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("#define CUDA_VERSION "))
        .and_then(|v| v.trim().parse().ok())
}

fn probe(root: &Path, found_by: &str) -> Option<Toolkit> {
    let include = root.join("include");
    let version = header_version(&include)?;
    let lib = ["lib64", "lib", "targets/x86_64-linux/lib"]
        .iter()
        .map(|d| root.join(d))
        .find(|d| d.join("libcudart_static.a").is_file())?;
    Some(Toolkit {
        root: root.to_path_buf(),
        include,
        lib,
        version,
        found_by: found_by.to_string(),
    })
}

fn site_dirs(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(v) = env("VIRTUAL_ENV") {
        if let Ok(rd) = std::fs::read_dir(Path::new(&v).join("lib")) {
            dirs.extend(rd.flatten().map(|e| e.path().join("site-packages")));
        }
    }
    let py = env("PYTHON").unwrap_or_else(|| "python3".into());
    let script =
        "import site,sys\nfor p in site.getsitepackages()+[site.getusersitepackages()]: print(p)";
    if let Ok(out) = std::process::Command::new(py)
        .arg("-c")
        .arg(script)
        .output()
    {
        dirs.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(PathBuf::from),
        );
    }
    dirs
}

/// The toolkit to build against, in the search order of this module's
/// documentation; Err is a message for the build's panic.
pub fn find(want: Want, env: &dyn Fn(&str) -> Option<String>) -> Result<Toolkit, String> {
    // 1. Our variable: an explicit choice, so a wrong major is an error.
    if let Some(home) = env("MOONCAKE_CUDA_HOME") {
        let tk = probe(Path::new(&home), "MOONCAKE_CUDA_HOME").ok_or_else(|| {
            format!(
                "mooncake-sys: MOONCAKE_CUDA_HOME={home} has no include/cuda.h with CUDA_VERSION and \
                 lib64/ (or lib/) libcudart_static.a"
            )
        })?;
        if !want.accepts(tk.major()) {
            return Err(mismatch(want, &tk, &[]));
        }
        return Ok(tk);
    }
    first_acceptable(want, candidates(want, env))
}

/// The majors to look for, in order of preference.
fn majors(want: Want) -> &'static [u32] {
    match want {
        Want::Major(12) => &[12],
        Want::Major(_) => &[13],
        Want::Either => &[13, 12],
    }
}

/// Steps 2 to 4 of the search order: every directory to probe, with how it
/// was found.
fn candidates(want: Want, env: &dyn Fn(&str) -> Option<String>) -> Vec<(PathBuf, String)> {
    let mut candidates: Vec<(PathBuf, String)> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = env(var) {
            candidates.push((PathBuf::from(v), var.to_string()));
        }
    }
    for m in majors(want) {
        candidates.extend(
            usr_local_toolkits(*m)
                .into_iter()
                .map(|p| (p, "/usr/local/cuda-*".to_string())),
        );
    }
    candidates.push((PathBuf::from("/usr/local/cuda"), "/usr/local/cuda".into()));
    for site in site_dirs(env) {
        for m in majors(want) {
            let sub = if *m == 12 {
                "nvidia/cuda_runtime"
            } else {
                "nvidia/cu13"
            };
            candidates.push((
                site.join(sub),
                format!("PyPI package in {}", site.display()),
            ));
        }
    }
    for m in majors(want) {
        if let Some(dir) = workspace_runtime(*m) {
            candidates.push((dir, "scripts/install-cuda-runtimes.sh".into()));
        }
    }
    candidates
}

/// Where `scripts/install-cuda-runtimes.sh` installs the runtime of `major`,
/// when this crate is built inside the workspace (its parent holds `.cuda`).
fn workspace_runtime(major: u32) -> Option<PathBuf> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let sub = if major == 12 {
        "cu12/nvidia/cuda_runtime"
    } else {
        "cu13/nvidia/cu13"
    };
    Some(manifest.parent()?.join(".cuda").join(sub))
}

/// `/usr/local/cuda-<major>*`, newest first.
fn usr_local_toolkits(major: u32) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir("/usr/local") else {
        return Vec::new();
    };
    let prefix = format!("cuda-{major}");
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect();
    v.sort();
    v.reverse();
    v
}

/// The first candidate holding a toolkit of an accepted major; else an
/// error naming the wrong-major toolkits seen, or saying none was found.
fn first_acceptable(want: Want, candidates: Vec<(PathBuf, String)>) -> Result<Toolkit, String> {
    let mut seen: Vec<String> = Vec::new();
    let mut wrong: Option<Toolkit> = None;
    for (root, how) in candidates {
        match probe(&root, &how) {
            Some(tk) if want.accepts(tk.major()) => return Ok(tk),
            Some(tk) => {
                seen.push(format!(
                    "{} (CUDA {}, via {how})",
                    root.display(),
                    tk.version_string()
                ));
                wrong.get_or_insert(tk);
            }
            None => {}
        }
    }
    match wrong {
        Some(tk) => Err(mismatch(want, &tk, &seen)),
        None => Err(format!(
            "mooncake-sys: {}, and none was found (looked at MOONCAKE_CUDA_HOME, CUDA_HOME, CUDA_PATH, \
             /usr/local/cuda*, Python site-packages, .cuda/): install one with \
             `pip install nvidia-cuda-runtime-cu12` (12.x) or `pip install nvidia-cuda-runtime` (13.x), \
             or run scripts/install-cuda-runtimes.sh in a checkout, or set MOONCAKE_CUDA_HOME to a \
             directory holding include/cuda.h and lib/libcudart_static.a",
            want.describe()
        )),
    }
}

fn mismatch(want: Want, tk: &Toolkit, seen: &[String]) -> String {
    let fix = match tk.major() {
        12 => "build with feature `cuda12` to match it".to_string(),
        13 => "build with feature `cuda13` to match it".to_string(),
        m => format!("CUDA {m}.x is not supported (12 and 13 are)"),
    };
    format!(
        "mooncake-sys: {}, but found CUDA {} at {} (via {}){}: {fix}, \
         or install the right major (`pip install nvidia-cuda-runtime-cu12` for 12.x, \
         `pip install nvidia-cuda-runtime` for 13.x) or point MOONCAKE_CUDA_HOME at it",
        want.describe(),
        tk.version_string(),
        tk.root.display(),
        tk.found_by,
        if seen.len() > 1 {
            format!("; also saw {}", seen[1..].join(", "))
        } else {
            String::new()
        }
    )
}

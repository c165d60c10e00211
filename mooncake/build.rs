//! Turns mooncake-sys's CUDA metadata (DEP_MOONCAKE_ENGINE_CUDA_MAJOR) into
//! cfgs: `mooncake_cuda` when GPU support is built in, and
//! `mooncake_cuda_major = "12" | "13"`.
fn main() {
    println!("cargo:rustc-check-cfg=cfg(mooncake_cuda)");
    println!("cargo:rustc-check-cfg=cfg(mooncake_cuda_major, values(\"12\", \"13\"))");
    println!("cargo:rerun-if-env-changed=DEP_MOONCAKE_ENGINE_CUDA_MAJOR");
    let major = std::env::var("DEP_MOONCAKE_ENGINE_CUDA_MAJOR").unwrap_or_default();
    if major == "12" || major == "13" {
        println!("cargo:rustc-cfg=mooncake_cuda");
        println!("cargo:rustc-cfg=mooncake_cuda_major=\"{major}\"");
    }
}

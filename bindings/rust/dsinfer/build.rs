//! Tests and examples of this crate find libdsinfer at run time through an rpath to the
//! directory dsinfer-sys linked against (its `cargo:lib_dir`).
fn main() {
    if let Ok(dir) = std::env::var("DEP_DSINFER_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
        println!("cargo:rustc-env=DSINFER_LINKED_LIB_DIR={}", dir);
    } else {
        println!("cargo:rustc-env=DSINFER_LINKED_LIB_DIR=");
    }
}

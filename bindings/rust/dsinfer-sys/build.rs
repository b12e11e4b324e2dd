//! Finds libdsinfer: `$DSINFER_LIB_DIR` (a directory holding libdsinfer.so) first, else
//! `pkg-config --libs dsinfer`. Dependent crates get the directory as
//! `DEP_DSINFER_LIB_DIR` (used for an rpath in their tests and examples).
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DSINFER_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");
    let mut dirs: Vec<String> = Vec::new();
    let mut libs: Vec<String> = Vec::new();
    if let Ok(dir) = env::var("DSINFER_LIB_DIR") {
        dirs.push(dir);
        libs.push("dsinfer".to_string());
    } else {
        let out = Command::new("pkg-config").args(["--libs", "dsinfer"]).output();
        let out = match out {
            Ok(o) if o.status.success() => o,
            Ok(o) => panic!(
                "dsinfer-sys: `pkg-config --libs dsinfer` failed ({}); install libdsinfer, \
                 point PKG_CONFIG_PATH at its dsinfer.pc, or set DSINFER_LIB_DIR to the \
                 directory of libdsinfer.so",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => panic!(
                "dsinfer-sys: cannot run pkg-config ({}); set DSINFER_LIB_DIR to the \
                 directory of libdsinfer.so",
                e
            ),
        };
        for tok in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Some(d) = tok.strip_prefix("-L") {
                dirs.push(d.to_string());
            } else if let Some(l) = tok.strip_prefix("-l") {
                libs.push(l.to_string());
            }
        }
    }
    for d in &dirs {
        println!("cargo:rustc-link-search=native={}", d);
    }
    for l in &libs {
        println!("cargo:rustc-link-lib=dylib={}", l);
    }
    if let Some(d) = dirs.first() {
        println!("cargo:lib_dir={}", d);
        // this crate's own tests (tests/header.rs) run against that library
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", d);
    }
}

//! Checks the hand-written declarations of src/lib.rs against include/dsinfer.h:
//! every function (parameter and return types, including const-ness of pointees), every
//! struct (field names and types in order), every callback type, every numeric constant;
//! and the layout of every struct against tests/abi/struct-layout.txt, which the C ABI
//! test pins against the header. Both files are parsed here with a small tokenizer: the
//! header's style (one declaration per statement, fixed-width types) keeps that simple.
use std::collections::BTreeMap;
use std::fs;
use std::mem::{size_of, MaybeUninit};
use std::path::PathBuf;

use dsinfer_sys::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

// ---- shared tokenizer ---------------------------------------------------------------------

fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
            out.push(' ');
        } else if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else {
            let c = src[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn tokens(src: &str) -> Vec<String> {
    let cs: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let s = i;
            while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            out.push(cs[s..i].iter().collect());
        } else if c == '"' {
            let s = i;
            i += 1;
            while i < cs.len() && cs[i] != '"' {
                i += 1;
            }
            i += 1;
            out.push(cs[s..i].iter().collect());
        } else if c == '-' && i + 1 < cs.len() && cs[i + 1] == '>' {
            out.push("->".to_string());
            i += 2;
        } else if c == '<' && i + 1 < cs.len() && cs[i + 1] == '<' {
            out.push("<<".to_string());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// Splits at `sep` tokens outside (), [], {} and <>.
fn split_top(t: &[String], sep: &str) -> Vec<Vec<String>> {
    let mut parts = vec![Vec::new()];
    let mut depth = 0i32;
    for tok in t {
        match tok.as_str() {
            "(" | "[" | "{" | "<" => depth += 1,
            ")" | "]" | "}" | ">" => depth -= 1,
            _ => {}
        }
        if depth == 0 && tok == sep {
            parts.push(Vec::new());
        } else {
            parts.last_mut().unwrap().push(tok.clone());
        }
    }
    if parts.last().map_or(false, |p| p.is_empty()) {
        parts.pop();
    }
    parts
}

fn scalar(name: &str) -> Option<&'static str> {
    Some(match name {
        "int32_t" | "i32" => "i32",
        "uint32_t" | "u32" => "u32",
        "uint64_t" | "u64" => "u64",
        "uint8_t" | "u8" => "u8",
        "size_t" | "usize" => "usize",
        "float" | "f32" => "f32",
        "double" | "f64" => "f64",
        "char" | "c_char" => "char",
        "void" | "c_void" => "void",
        _ => return None,
    })
}

#[derive(Default)]
struct Api {
    functions: BTreeMap<String, String>,
    structs: BTreeMap<String, Vec<(String, String)>>,
    fn_types: BTreeMap<String, String>,
    constants: BTreeMap<String, i64>,
}

// ---- the C header ---------------------------------------------------------------------------

struct C<'a> {
    aliases: &'a BTreeMap<String, String>,
}

impl<'a> C<'a> {
    fn base(&self, name: &str) -> String {
        if let Some(s) = scalar(name) {
            return s.to_string();
        }
        if let Some(a) = self.aliases.get(name) {
            return a.clone();
        }
        assert!(name.starts_with("dsi_"), "unknown C type {}", name);
        format!("struct:{}", name)
    }

    /// (name, canonical type) of one declaration: `T *const *name`, `T name[N]`,
    /// `R (*name)(params)`.
    fn decl(&self, t: &[String]) -> (String, String) {
        if let Some(p) = t.iter().position(|x| x == "(") {
            if t.get(p + 1).map(|s| s.as_str()) == Some("*") {
                let name = t[p + 2].clone();
                let ret = self.ty(&t[..p]);
                let close = t.iter().rposition(|x| x == ")").unwrap();
                let params = self.params(&t[p + 5..close]);
                return (name, format!("fn({})->{}", params, ret));
            }
        }
        if let Some(p) = t.iter().position(|x| x == "[") {
            let n = &t[p + 1];
            return (t[p - 1].clone(), format!("arr({},{})", n, self.ty(&t[..p - 1])));
        }
        let last = t.last().unwrap();
        if t.len() > 1 && last != "*" && scalar(last).is_none() && !last.starts_with("dsi_") {
            (last.clone(), self.ty(&t[..t.len() - 1]))
        } else {
            (String::new(), self.ty(t))
        }
    }

    /// A type without a declarator name.
    fn ty(&self, t: &[String]) -> String {
        let mut konst = false;
        let mut cur = String::new();
        for tok in t {
            match tok.as_str() {
                "const" => konst = true,
                "*" => {
                    cur = format!("{}({})", if konst { "cptr" } else { "mptr" }, cur);
                    konst = false;
                }
                "DSI_API" | "struct" => {}
                other => cur = self.base(other),
            }
        }
        cur
    }

    fn params(&self, t: &[String]) -> String {
        if t.len() == 1 && t[0] == "void" || t.is_empty() {
            return String::new();
        }
        split_top(t, ",").iter().map(|p| self.decl(p).1).collect::<Vec<_>>().join(",")
    }
}

fn parse_header() -> Api {
    let src = fs::read_to_string(repo().join("include/dsinfer.h")).unwrap();
    let src = strip_comments(&src);
    let mut api = Api::default();
    let mut body = String::new();
    let mut skip = false;
    for line in src.lines() {
        let l = line.trim();
        if l.starts_with("#ifdef __cplusplus") {
            skip = true;
        } else if skip && l.starts_with("#endif") {
            skip = false;
        } else if l.starts_with("#define") {
            let t = tokens(l); // "#", "define", NAME, value...
            if t.len() >= 4 && t[2].starts_with("DSI_") {
                if let Some(v) = const_value(&t[3..]) {
                    api.constants.insert(t[2].clone(), v);
                }
            }
        } else if !skip && !l.starts_with('#') {
            body.push_str(line);
            body.push('\n');
        }
    }
    let stmts = split_top(&tokens(&body), ";");
    // first pass: typedef names of scalars, handles and callbacks
    let mut aliases = BTreeMap::new();
    for s in &stmts {
        if s.first().map(|x| x.as_str()) != Some("typedef") {
            continue;
        }
        if s[1] == "struct" && s.len() == 4 {
            aliases.insert(s[3].clone(), format!("struct:{}", s[3]));
        } else if s[1] != "struct" && s.len() == 3 {
            aliases.insert(s[2].clone(), scalar(&s[1]).unwrap().to_string());
        }
    }
    for s in &stmts {
        if s.first().map(|x| x.as_str()) == Some("typedef") && s.contains(&"(".to_string()) && s[1] != "struct" {
            let (name, ty) = C { aliases: &aliases }.decl(&s[1..]);
            aliases.insert(name.clone(), ty.clone());
            api.fn_types.insert(name, ty);
        }
    }
    let c = C { aliases: &aliases };
    for s in &stmts {
        match s.first().map(|x| x.as_str()) {
            Some("typedef") if s[1] == "struct" && s.get(3).map(|x| x.as_str()) == Some("{") => {
                let close = s.iter().rposition(|x| x == "}").unwrap();
                let fields = split_top(&s[4..close], ";").iter().map(|f| c.decl(f)).collect();
                api.structs.insert(s[2].clone(), fields);
            }
            Some("enum") => {
                let close = s.iter().rposition(|x| x == "}").unwrap();
                for e in split_top(&s[2..close], ",") {
                    api.constants.insert(e[0].clone(), const_value(&e[2..]).unwrap());
                }
            }
            Some("DSI_API") => {
                let open = s.iter().position(|x| x == "(").unwrap();
                let name = s[open - 1].clone();
                let ret = c.ty(&s[1..open - 1]);
                let params = c.params(&s[open + 1..s.len() - 1]);
                api.functions.insert(name, format!("({})->{}", params, ret));
            }
            _ => {}
        }
    }
    api
}

/// Value of `-3`, `12`, `(1u << 16)`, `1 << 16`.
fn const_value(t: &[String]) -> Option<i64> {
    let t: Vec<&str> = t.iter().map(|s| s.as_str()).filter(|s| *s != "(" && *s != ")").collect();
    let num = |s: &str| {
        let s = s.trim_end_matches('u').replace('_', "");
        match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(h) => i64::from_str_radix(h, 16).ok(),
            None => s.parse::<i64>().ok(),
        }
    };
    match t.as_slice() {
        [n] => num(n),
        ["-", n] => num(n).map(|v| -v),
        [a, "<<", b] => Some(num(a)? << num(b)?),
        _ => None,
    }
}

// ---- the Rust declarations -------------------------------------------------------------------

fn rust_ty(t: &[String], aliases: &BTreeMap<String, String>) -> String {
    if t.last().map(|x| x.as_str()) == Some(",") {
        return rust_ty(&t[..t.len() - 1], aliases); // rustfmt's trailing comma in Option<..,>
    }
    let s: Vec<&str> = t.iter().map(|x| x.as_str()).collect();
    match s.as_slice() {
        ["*", "const", rest @ ..] => format!("cptr({})", rust_ty(&t[2..2 + rest.len()], aliases)),
        ["*", "mut", rest @ ..] => format!("mptr({})", rust_ty(&t[2..2 + rest.len()], aliases)),
        ["[", .., "]"] => {
            let semi = s.iter().position(|x| *x == ";").unwrap();
            format!("arr({},{})", s[semi + 1], rust_ty(&t[1..semi], aliases))
        }
        ["Option", "<", .., ">"] => rust_ty(&t[2..t.len() - 1], aliases),
        ["unsafe", "extern", _, "fn", ..] => {
            let open = 4;
            let close = t.iter().rposition(|x| x == ")").unwrap();
            let params = rust_params(&t[open + 1..close], aliases);
            let ret = if close + 1 < t.len() { rust_ty(&t[close + 2..], aliases) } else { "void".to_string() };
            format!("fn({})->{}", params, ret)
        }
        [one] => scalar(one)
            .map(|x| x.to_string())
            .or_else(|| aliases.get(*one).cloned())
            .unwrap_or_else(|| format!("struct:{}", one)),
        _ => panic!("unknown Rust type {:?}", s),
    }
}

fn rust_params(t: &[String], aliases: &BTreeMap<String, String>) -> String {
    split_top(t, ",")
        .iter()
        .map(|p| {
            let colon = p.iter().position(|x| x == ":").unwrap();
            rust_ty(&p[colon + 1..], aliases)
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_rust() -> Api {
    let src = fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let src: String = strip_comments(&src).lines().filter(|l| !l.trim_start().starts_with("#")).collect::<Vec<_>>().join("\n");
    let t = tokens(&src);
    let mut api = Api::default();
    let mut aliases = BTreeMap::new();
    // `pub type` first (they may be used before their definition)
    for s in split_top(&t, ";") {
        if let Some(p) = s.windows(2).position(|w| w[0] == "pub" && w[1] == "type") {
            let s = &s[p..];
            let ty = rust_ty(&s[4..], &aliases);
            if ty.starts_with("fn(") {
                api.fn_types.insert(s[2].clone(), ty.clone());
            }
            aliases.insert(s[2].clone(), ty);
        }
    }
    let mut i = 0;
    while i < t.len() {
        if t[i] == "pub" && t[i + 1] == "struct" {
            let name = t[i + 2].clone();
            let mut depth = 0;
            let start = i + 4;
            let mut j = start;
            loop {
                match t[j].as_str() {
                    "{" | "(" | "[" | "<" => depth += 1,
                    "}" if depth == 0 => break,
                    "}" | ")" | "]" | ">" => depth -= 1,
                    _ => {}
                }
                j += 1;
            }
            let fields: Vec<(String, String)> = split_top(&t[start..j], ",")
                .iter()
                .filter(|f| f[0] == "pub")
                .map(|f| (f[1].trim_end_matches('_').to_string(), rust_ty(&f[3..], &aliases)))
                .collect();
            if !fields.is_empty() {
                api.structs.insert(name, fields);
            }
            i = j;
        } else if t[i] == "pub" && t[i + 1] == "fn" {
            let name = t[i + 2].clone();
            let semi = (i..t.len()).find(|&k| t[k] == ";").unwrap();
            let close = (i..semi).rev().find(|&k| t[k] == ")").unwrap();
            let params = rust_params(&t[i + 4..close], &aliases);
            let ret = if close + 1 < semi { rust_ty(&t[close + 2..semi], &aliases) } else { "void".to_string() };
            api.functions.insert(name, format!("({})->{}", params, ret));
            i = semi;
        } else if t[i] == "pub" && t[i + 1] == "const" {
            let semi = (i..t.len()).find(|&k| t[k] == ";").unwrap();
            let eq = (i..semi).find(|&k| t[k] == "=").unwrap();
            api.constants.insert(t[i + 2].clone(), const_value(&t[eq + 1..semi]).expect(&t[i + 2]));
            i = semi;
        }
        i += 1;
    }
    api
}

// ---- the checks ---------------------------------------------------------------------------------

#[test]
fn functions_match_the_header() {
    let (c, r) = (parse_header(), parse_rust());
    assert!(c.functions.len() >= 60, "parsed only {} C functions", c.functions.len());
    let missing: Vec<_> = c.functions.keys().filter(|k| !r.functions.contains_key(*k)).collect();
    assert!(missing.is_empty(), "declared in dsinfer.h but not in dsinfer-sys: {:?}", missing);
    let extra: Vec<_> = r.functions.keys().filter(|k| !c.functions.contains_key(*k)).collect();
    assert!(extra.is_empty(), "declared in dsinfer-sys but not in dsinfer.h: {:?}", extra);
    for (name, sig) in &c.functions {
        assert_eq!(&r.functions[name], sig, "signature of {}", name);
    }
}

#[test]
fn structs_and_callbacks_match_the_header() {
    let (c, r) = (parse_header(), parse_rust());
    assert!(c.structs.len() >= 12);
    for (name, fields) in &c.structs {
        let rf = r.structs.get(name).unwrap_or_else(|| panic!("struct {} missing", name));
        assert_eq!(rf, fields, "fields of {}", name);
    }
    assert_eq!(r.structs.len(), c.structs.len(), "dsinfer-sys has structs the header lacks");
    assert!(c.fn_types.len() >= 6);
    assert_eq!(r.fn_types, c.fn_types);
}

#[test]
fn constants_match_the_header() {
    let (c, r) = (parse_header(), parse_rust());
    assert!(c.constants.len() >= 90, "parsed only {} C constants", c.constants.len());
    for (name, v) in &c.constants {
        assert_eq!(r.constants.get(name), Some(v), "constant {}", name);
    }
}

fn size_of_pointee<T>(_: *const T) -> usize {
    size_of::<T>()
}

macro_rules! layout {
    ($($t:ident { $($f:ident),* })*) => {{
        let mut v: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        $(
            v.insert(format!("{} sizeof", stringify!($t)), (size_of::<$t>(), 0));
            $({
                let u = MaybeUninit::<$t>::uninit();
                let base = u.as_ptr();
                // no reference to uninitialised memory is made: addr_of! only
                let fp = unsafe { std::ptr::addr_of!((*base).$f) };
                v.insert(format!("{}.{}", stringify!($t), stringify!($f).trim_end_matches('_')),
                         (fp as usize - base as usize, size_of_pointee(fp)));
            })*
        )*
        v
    }};
}

#[test]
fn layout_matches_the_pinned_layout() {
    let ours = layout! {
        dsi_context_options { struct_size, abi_version, log_fn, log_user_data, log_level, n_threads,
            malloc_fn, realloc_fn, free_fn, alloc_user_data, backend, backend_dir, device_index, flags,
            devices }
        dsi_device_info { struct_size, type_, backend, name, memory_total, memory_free, max_buffer_size,
            features, subgroup_size, index, reserved }
        dsi_model_options { struct_size, access, progress_fn, progress_user_data, flags, reserved,
            draft_path, place }
        dsi_reader { struct_size, reserved, size, pread_fn, close_fn, user_data }
        dsi_model_info { struct_size, arch, arch_name, name, n_layers, n_embd, n_vocab, n_heads,
            n_ctx_train, n_experts, n_experts_used, n_draft_layers, has_mtp, has_dspark, has_engram,
            reserved, n_params, weight_bytes, fingerprint }
        dsi_chat_message { struct_size, role, content, reasoning }
        dsi_chat_options { struct_size, thinking, add_generation_prompt, add_bos }
        dsi_session_options { struct_size, n_ctx, n_batch, flags, spec, draft_max, draft_confidence,
            spec_reserved }
        dsi_logit_bias { token, bias }
        dsi_sampler_options { struct_size, temperature, top_k, top_p, min_p, repetition_penalty,
            frequency_penalty, presence_penalty, penalty_last_n, reserved, seed, logit_bias, n_logit_bias }
        dsi_generate_options { struct_size, max_tokens, prompt, n_prompt, stop_tokens, n_stop_tokens,
            stop_strings, n_stop_strings, on_token, user_data, flags, reserved }
        dsi_generate_result { struct_size, finish_reason, n_prompt, n_reused, n_generated, prefill_ms, decode_ms,
            n_spec_steps, n_drafted, n_accepted }
    };
    let pinned = fs::read_to_string(repo().join("tests/abi/struct-layout.txt")).unwrap();
    let mut n = 0;
    for line in pinned.lines().filter(|l| !l.trim().is_empty()) {
        let p: Vec<&str> = line.split_whitespace().collect();
        if p[1] == "sizeof" {
            let key = format!("{} sizeof", p[0]);
            let got = ours.get(&key).unwrap_or_else(|| panic!("{} not checked", key));
            assert_eq!(got.0, p[2].parse::<usize>().unwrap(), "{}", line);
        } else {
            let got = ours.get(p[0]).unwrap_or_else(|| panic!("{} not in the layout table", p[0]));
            assert_eq!((got.0, got.1), (p[1].parse().unwrap(), p[2].parse().unwrap()), "{}", line);
        }
        n += 1;
    }
    assert!(n > 100);
}

#[test]
fn the_library_is_the_abi_we_declare() {
    // linked for real: the version functions answer as the header says
    let v = unsafe { std::ffi::CStr::from_ptr(dsi_version_string()) }.to_str().unwrap().to_string();
    assert_eq!(v, format!("{}.{}.{}", DSI_VERSION_MAJOR, DSI_VERSION_MINOR, DSI_VERSION_PATCH));
    assert!(unsafe { dsi_abi_version() } >= DSI_ABI_VERSION);
}

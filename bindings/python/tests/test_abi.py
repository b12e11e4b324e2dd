"""The ctypes declarations against the C header: struct layout (tests/abi/struct-layout.txt,
which tests/abi pins against include/dsinfer.h), every prototype, every constant."""
import ctypes
import os
import re

from dsinfer import _ffi
from conftest import REPO

HEADER = os.path.join(REPO, "include", "dsinfer.h")
LAYOUT = os.path.join(REPO, "tests", "abi", "struct-layout.txt")
HANDLES = {"dsi_context", "dsi_model", "dsi_session", "dsi_sampler", "dsi_detokenizer"}
SCALARS = {"int32_t": "i32", "dsi_status": "i32", "dsi_token": "i32", "uint32_t": "u32",
           "uint64_t": "u64", "size_t": "size", "float": "f32", "double": "f64",
           "void": "void", "char": "char"}


def header_text():
    with open(HEADER, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def c_canon(decl):
    """Canonical form of a C type (parameter name removed)."""
    decl = re.sub(r"\bconst\b", " ", decl).strip()
    stars = decl.count("*")
    base = decl.replace("*", " ").split()
    if not base:
        raise ValueError(decl)
    if len(base) > 1 and base[-1] not in SCALARS and base[-1] not in HANDLES and \
            not base[-1].startswith("dsi_"):
        base = base[:-1]  # drop the parameter name
    name = base[-1] if len(base) == 1 else " ".join(base)
    if name in HANDLES:
        assert stars >= 1, decl
        t, stars = "handle", stars - 1
    elif name in SCALARS:
        t = SCALARS[name]
    elif name.startswith("dsi_"):
        t = "struct:" + name
    else:
        raise ValueError("unknown C type %r" % decl)
    for _ in range(stars):
        t = "ptr(%s)" % t
    return t


CT_SCALARS = {ctypes.c_int32: "i32", ctypes.c_uint32: "u32", ctypes.c_uint64: "u64",
              ctypes.c_size_t: "size", ctypes.c_float: "f32", ctypes.c_double: "f64",
              ctypes.c_char_p: "ptr(char)", ctypes.c_void_p: "handle", None: "void",
              ctypes.c_char: "char"}


# the header's callback typedefs that appear as function parameters: dsi_write_fn and
# dsi_read_fn share one C signature (int32_t (*)(void *, [const] void *, size_t)), so ctypes
# gives them one type; both sides compare by that signature
CT_CALLBACKS = {_ffi.WRITE_FN: "fn(i32;handle,handle,size)", _ffi.READ_FN: "fn(i32;handle,handle,size)"}
HDR_CALLBACKS = {"struct:dsi_write_fn": "fn(i32;handle,handle,size)",
                 "struct:dsi_read_fn": "fn(i32;handle,handle,size)"}


def ct_canon(t):
    if t in CT_CALLBACKS:
        return CT_CALLBACKS[t]
    if t in CT_SCALARS:
        return CT_SCALARS[t]
    if isinstance(t, type) and issubclass(t, ctypes.Structure):
        return "struct:dsi_" + t.__name__
    if hasattr(t, "_type_") and isinstance(t._type_, type):  # POINTER(x)
        return "ptr(%s)" % ct_canon(t._type_)
    raise ValueError("unknown ctypes type %r" % t)


def same_width(t):
    """size_t and uint64_t are one ctypes type on LP64: compare them as one; a `void *`
    parameter is a c_void_p ("handle") in ctypes; callbacks compare by signature."""
    t = HDR_CALLBACKS.get(t, t)
    t = "handle" if t == "ptr(void)" else t
    return t.replace("size", "u64") if ctypes.c_size_t is ctypes.c_uint64 else t


def header_prototypes():
    out = {}
    for m in re.finditer(r"DSI_API\s+([^;{]*?)\b(dsi_\w+)\s*\(([^)]*)\)\s*;", header_text()):
        ret, name, params = m.group(1), m.group(2), m.group(3).strip()
        args = [] if params in ("", "void") else [c_canon(p) for p in params.split(",")]
        out[name] = (c_canon(ret), args)
    return out


def test_every_header_function_is_declared_exactly():
    hdr = header_prototypes()
    assert len(hdr) >= 60
    declared = dict(_ffi.PROTOTYPES)
    declared.update(_ffi.OPTIONAL)
    missing = sorted(set(hdr) - set(declared))
    assert not missing, "functions of dsinfer.h missing from bindings/python/dsinfer/_ffi.py"
    extra = sorted(set(declared) - set(hdr))
    assert not extra, "declared but not in dsinfer.h: %s" % extra
    for name, (ret, args) in declared.items():
        want = (same_width(hdr[name][0]), [same_width(a) for a in hdr[name][1]])
        got = (same_width(ct_canon(ret)), [same_width(ct_canon(a)) for a in args])
        assert got == want, name


def test_struct_layout_matches_pinned_layout():
    checked = 0
    with open(LAYOUT) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            cls = getattr(_ffi, parts[0].split(".")[0][len("dsi_"):])
            if parts[1] == "sizeof":
                assert ctypes.sizeof(cls) == int(parts[2]), parts[0]
            else:
                fld = getattr(cls, parts[0].split(".")[1])
                assert (fld.offset, fld.size) == (int(parts[1]), int(parts[2])), parts[0]
            checked += 1
    assert checked > 100


def header_constants():
    text = header_text()
    consts = {}
    for m in re.finditer(r"\b(DSI_[A-Z0-9_]+)\s*=\s*(-?\d+)", text):
        consts[m.group(1)] = int(m.group(2))
    for m in re.finditer(r"#define\s+(DSI_[A-Z0-9_]+)\s+\(?\s*(\d+)u?\s*(?:<<\s*(\d+))?\s*\)?\s*$",
                         text, re.M):
        v = int(m.group(2)) << int(m.group(3) or 0)
        consts[m.group(1)] = v
    return consts


def test_constants_match_header():
    hdr = header_constants()
    groups = ("DSI_ERR_", "DSI_LOG_", "DSI_ACCESS_", "DSI_MODEL_FLAG_", "DSI_ARCH_", "DSI_TOKENIZE_",
              "DSI_SPECIAL_", "DSI_ROLE_", "DSI_THINKING_", "DSI_FINISH_", "DSI_SESSION_FLAG_")
    n = 0
    for name, v in hdr.items():
        if name == "DSI_OK" or name.startswith(groups):
            assert getattr(_ffi, name[len("DSI_"):]) == v, name
            n += 1
    assert n > 50
    assert hdr["DSI_ABI_VERSION"] == _ffi.ABI_VERSION


def test_init_struct_declares_our_size():
    lib = ctypes.CDLL(__import__("dsinfer").library_path)
    _ffi.bind(lib)
    o = _ffi.init_struct(_ffi.sampler_options, lib.dsi_sampler_options_init)
    assert o.struct_size == ctypes.sizeof(_ffi.sampler_options)
    assert o.temperature == 1.0 and o.top_p == 1.0 and o.penalty_last_n == 64

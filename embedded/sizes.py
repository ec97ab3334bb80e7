#!/usr/bin/env python3
"""Flash and static RAM of the firmware images (docs/benchmarks/embedded.md).

  embedded/sizes.py [TARGET_DIR]      after `cargo build --release` in embedded/

Prints, in the release profile (opt-level "z", LTO, one codegen unit):
1. each image's sections (.vector_table, .text, .rodata, .data, .bss);
2. the path's cost as layers: `http` (http-nostd), `http_sse` (+ sse-nostd), `path`
   (+ llama-proto), and `httparse_head` (httparse alone, the anchor), each minus `baseline`
   (runtime and the fixture bytes);
3. the `path` image's flash attributed to crates by its DWARF line table: every byte of .text
   to the source file of the (innermost inlined) code it was compiled from, so code that LTO
   inlined into the caller still counts for the crate it came from; .rodata by symbol name.
Standard library only; llvm-size, llvm-nm and llvm-objdump come from rustup's llvm-tools, which
this script adds (`rustup component add llvm-tools`) when they are missing.
"""
import collections
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = "thumbv7m-none-eabi"
IMAGES = ["baseline", "http", "http_sse", "path", "httparse_head", "check"]


def tool(name):
    sysroot = subprocess.check_output(["rustc", "--print", "sysroot"], text=True).strip()
    host = re.search(r"host: (\S+)", subprocess.check_output(["rustc", "-vV"], text=True))[1]
    path = os.path.join(sysroot, "lib", "rustlib", host, "bin", name)
    if not os.path.exists(path):
        # As `make test` adds its targets: the component of the pinned toolchain, when missing.
        print(f"sizes.py: {name} missing; rustup component add llvm-tools", file=sys.stderr)
        subprocess.check_call(["rustup", "component", "add", "llvm-tools"], stdout=sys.stderr)
    if not os.path.exists(path):
        sys.exit(f"{path} still missing after rustup component add llvm-tools")
    return path


def sections(elf):
    out = subprocess.check_output([tool("llvm-size"), "-A", elf], text=True)
    s = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith("."):
            s[parts[0]] = int(parts[1])
    return {k: s.get(k, 0) for k in (".vector_table", ".text", ".rodata", ".data", ".bss")}


def bucket_of_file(path, line):
    p = path.replace("\\", "/")
    for marker, name in [
        ("/crates/http-nostd/", "http-nostd"),
        ("/crates/sse-nostd/", "sse-nostd"),
        ("/crates/llama-proto/", "llama-proto"),
        ("/httparse-", "httparse"),
        ("/memchr-", "memchr"),
        ("/heapless-", "heapless"),
        ("/serde-json-core-", "serde-json-core"),
        ("/serde_json_core-", "serde-json-core"),
        ("/serde_core-", "serde"),
        ("/serde-1.", "serde"),
        ("/emsha-", "emsha"),
        ("/cortex-m-rt-", "runtime (cortex-m-rt, semihosting)"),
        ("/cortex-m-semihosting-", "runtime (cortex-m-rt, semihosting)"),
        ("/cortex-m-0.", "runtime (cortex-m-rt, semihosting)"),
        ("compiler-builtins", "compiler-builtins (memcpy, memmove, memset)"),
        ("/library/core/", "core (generic library code inlined into the crates)"),
        ("/embedded/src/", "the image (src/lib.rs run loop, main, expected answer)"),
    ]:
        if marker in p:
            if name == "llama-proto":
                if p.endswith("/raw.rs") and derive_line(path, line):
                    return "serde derive (llama-proto's 3 derived wire structs)"
                return "llama-proto " + p.split("/crates/llama-proto/")[1]
            return name
    return "no source file" if p == "??" else "other: " + p


_derive_cache = {}


def derive_line(path, line):
    """True when the source line is a `#[derive(...Deserialize...)]` (derived code's location)."""
    if path not in _derive_cache:
        try:
            with open(path) as f:
                _derive_cache[path] = f.read().splitlines()
        except OSError:
            _derive_cache[path] = []
    lines = _derive_cache[path]
    return 0 < line <= len(lines) and "derive(" in lines[line - 1] and "Deserialize" in lines[line - 1]


def bucket_of_symbol(sym):
    for marker, name in [
        ("compiler_builtins", "compiler-builtins (memcpy, memmove, memset)"),
        ("__aeabi_", "compiler-builtins (memcpy, memmove, memset)"),
        ("mem", "compiler-builtins (memcpy, memmove, memset)"),
        ("OUTLINED_FUNCTION", "outlined sequences (shared by LLVM's outliner)"),
        ("cortex_m", "runtime (cortex-m-rt, semihosting)"),
        ("Reset", "runtime (cortex-m-rt, semihosting)"),
        ("Handler", "runtime (cortex-m-rt, semihosting)"),
        ("__pre_init", "runtime (cortex-m-rt, semihosting)"),
        ("HardFault", "runtime (cortex-m-rt, semihosting)"),
    ]:
        if marker in sym:
            return name
    return "no line info: " + sym


def inline_chains(elf, addrs):
    """For each address, the source (file, line) of every inlined frame, innermost first, from
    llvm-symbolizer (None when it is not installed)."""
    symbolizer = shutil.which("llvm-symbolizer")
    if symbolizer is None:
        return None
    out = subprocess.run(
        [symbolizer, "--inlining", "--obj=" + elf],
        input="".join(f"0x{a:x}\n" for a in addrs), capture_output=True, text=True, check=True,
    ).stdout
    chains = []
    for block in out.split("\n\n")[: len(addrs)]:
        frames = []
        lines = block.strip("\n").split("\n")
        for loc in lines[1::2]:
            m = re.match(r"^(.*):(\d+):\d+$", loc)
            frames.append((m[1], int(m[2])) if m else None)
        chains.append(frames)
    return chains


def is_library(path):
    return "/library/" in path and path.startswith("/rustc/")


def text_by_crate(elf):
    """Bytes of .text per crate. Each instruction counts for the crate whose code it was
    compiled from: the innermost inlined frame outside Rust's own library (so a bounds check
    or an `Option::map` inlined into http-nostd counts for http-nostd), found with
    llvm-symbolizer; without it, the innermost frame from llvm-objdump's line table."""
    out = subprocess.check_output(
        [tool("llvm-objdump"), "-d", "-l", "--no-show-raw-insn", "-j", ".text", elf], text=True
    )
    rows = []  # (address, bucket)
    src = None
    sym = None
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.*)>:$", line)
        if m:
            sym, src = m[2], None
            continue
        m = re.match(r"^; (/.*):(\d+)$", line)
        if m:
            src = (m[1], int(m[2]))
            continue
        m = re.match(r"^\s+([0-9a-f]+):", line)
        if m:
            addr = int(m[1], 16)
            b = bucket_of_file(*src) if src else bucket_of_symbol(sym or "")
            rows.append((addr, b))
    chains = inline_chains(elf, [a for a, _ in rows])
    if chains is not None:
        for i, (addr, b) in enumerate(rows):
            frames = [f for f in chains[i] if f is not None]
            outside = [f for f in frames if not is_library(f[0])]
            if outside:
                rows[i] = (addr, bucket_of_file(*outside[0]))
    size = sections(elf)[".text"]
    start = rows[0][0]
    total = collections.Counter()
    for (addr, b), nxt in zip(rows, rows[1:] + [(start + size, None)]):
        total[b] += nxt[0] - addr
    return total, chains is not None


def rodata_symbols(elf):
    """The named symbols in .rodata, largest first: (size, name)."""
    out = subprocess.check_output([tool("llvm-size"), "-A", "-x", elf], text=True)
    start = end = 0
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == ".rodata":
            end = int(parts[1], 16)
            start = int(parts[2], 16)
            end += start
    out = subprocess.check_output([tool("llvm-nm"), "-C", "-S", "--size-sort", elf], text=True)
    syms = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and start <= int(parts[0], 16) < end and int(parts[1], 16) > 0:
            syms.append((int(parts[1], 16), parts[3]))
    return sorted(syms, reverse=True)


def main():
    target_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "target")
    elf = lambda name: os.path.join(target_dir, TARGET, "release", name)
    secs = {name: sections(elf(name)) for name in IMAGES}
    print("| image | .vector_table | .text | .rodata | .data | .bss |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in IMAGES:
        s = secs[name]
        print(f"| `{name}` | {s['.vector_table']} | {s['.text']} | {s['.rodata']} | {s['.data']} | {s['.bss']} |")

    flash = lambda n: secs[n][".text"] + secs[n][".rodata"]
    ram = lambda n: secs[n][".data"] + secs[n][".bss"]
    base = flash("baseline")
    print()
    print("| layer (image minus `baseline`) | flash (.text + .rodata) | of which the layer's own |")
    print("| --- | ---: | ---: |")
    prev = base
    for name, label in [
        ("http", "http-nostd (and httparse)"),
        ("http_sse", "+ sse-nostd (and memchr)"),
        ("path", "+ llama-proto (and heapless): the whole path, `ChatStream`"),
    ]:
        print(f"| {label}, `{name}` | {flash(name) - base} | {flash(name) - prev} |")
        prev = flash(name)
    print(f"| anchor: httparse alone parsing the head, `httparse_head` | {flash('httparse_head') - base} | |")
    print()
    print(f"static RAM (.data + .bss): path {ram('path')}, baseline {ram('baseline')}, check {ram('check')}")

    print()
    text, inlined = text_by_crate(elf("path"))
    how = "inlined frames by llvm-symbolizer" if inlined else "innermost line only: no llvm-symbolizer"
    print(f"`path` .text by crate ({how}), {sum(text.values())} bytes:")
    print()
    print("| crate | .text bytes |")
    print("| --- | ---: |")
    for b, n in text.most_common():
        print(f"| {b} | {n} |")
    print()
    syms = rodata_symbols(elf("path"))
    named = sum(n for n, _ in syms)
    print(f"`path` .rodata: {secs['path']['.rodata']} bytes, {named} in named symbols "
          f"(the fixture, {secs['baseline']['.rodata']} bytes, is the unnamed rest with a few "
          "small constants):")
    print()
    for n, sym in syms:
        print(f"- {n} {sym}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Rewrites the CUDA kernel launches of a .cu file for the CPU emulation (README.md here):

    kernel<T...><<<grid, block, shared, stream>>>(args...)
 -> ::cuda_emulation::launch(grid, block, shared, stream, "kernel", kernel<T...>, args...)

so that the host compiler takes the file. Usage: rewrite_launches.py IN.cu OUT.cpp
"""
import sys


def kernel_start(src, at):
    """Where the kernel expression before the '<<<' at `at` starts: an identifier (possibly
    qualified) with an optional template argument list."""
    j = at - 1
    while j >= 0 and src[j].isspace():
        j -= 1
    if src[j] == ">":  # a template argument list: back to its '<'
        depth = 0
        while j >= 0:
            if src[j] == ">":
                depth += 1
            elif src[j] == "<":
                depth -= 1
                if depth == 0:
                    break
            j -= 1
        j -= 1
    while j >= 0 and (src[j].isalnum() or src[j] in "_:"):
        j -= 1
    return j + 1


def closing(src, at, open_char, close_char):
    depth = 0
    for k in range(at, len(src)):
        if src[k] == open_char:
            depth += 1
        elif src[k] == close_char:
            depth -= 1
            if depth == 0:
                return k
    raise ValueError("unbalanced %s at offset %d" % (open_char, at))


def split_top_level(s):
    parts, depth, current = [], 0, ""
    for ch in s:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    return parts


def rewrite(src):
    while True:
        at = src.find("<<<")
        if at < 0:
            return src
        start = kernel_start(src, at)
        kernel = src[start:at].strip()
        config_end = src.find(">>>", at)
        config = split_top_level(src[at + 3 : config_end])
        if len(config) == 2:
            config.append("0")
        if len(config) == 3:
            config.append("nullptr")
        args_open = src.find("(", config_end)
        args_close = closing(src, args_open, "(", ")")
        args = src[args_open + 1 : args_close].strip()
        name = kernel.split("<", 1)[0].split("::")[-1].strip()  # for the emulation's injected faults
        call = '::cuda_emulation::launch(%s, "%s", %s%s)' % (", ".join(config), name, kernel, ", " + args if args else "")
        src = src[:start] + call + src[args_close + 1 :]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        text = f.read()
    with open(sys.argv[2], "w") as f:
        f.write("// Generated from %s by rewrite_launches.py: do not edit.\n" % sys.argv[1] + rewrite(text))

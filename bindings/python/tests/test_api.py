"""Plan construction, argument validation, errors, lifetime, loading."""

import ctypes
import gc
import os
import subprocess
import sys
import weakref

import ml_dtypes
import numpy as np
import pytest

import lnmlp
from lnmlp import _capi, _lib, _plan

T, H, F = 6, 8, 12


def arrays(A=1, dtype=np.float32, norm="layernorm", bias1=False, bias2=False, lead=(2, 3)):
    rng = np.random.default_rng(0)
    f = lambda *s: np.ascontiguousarray(rng.standard_normal(s).astype(dtype))  # noqa: E731
    return dict(x=f(*lead, H), gamma=f(H), beta=f(H) if norm == "layernorm" else None,
                w1=f(H, A, F), b1=f(A, F) if bias1 else None, w2=f(F, H),
                b2=f(H) if bias2 else None)


def fwd(plan, a, **override):
    a = dict(a, **override)
    return plan.forward(a["x"], a["gamma"], a["beta"], a["w1"], a["b1"], a["w2"], a["b2"])


@pytest.fixture
def plan():
    with lnmlp.Plan(T, H, F) as p:
        yield p


# --- metadata and loading ---------------------------------------------------------------------------
def test_version_and_build_info():
    # The package is released with the library: the same version.
    assert lnmlp.__version__ == "%d.%d.%d" % tuple(lnmlp.library_version()[:3]) == "0.2.0"
    assert lnmlp.library_version()[3] == lnmlp.ABI_VERSION == 2
    assert _lib.SONAME == "liblnmlp.so.2"
    assert "lnmlp" in lnmlp.build_info()
    assert lnmlp.query_support("cpu", "backend") is True
    assert lnmlp.query_support("cuda", "backend") is False
    with pytest.raises(lnmlp.InvalidArgumentError):
        lnmlp.query_support("cpu", "warp_drive")


def test_every_generated_prototype_resolves():
    # _capi.py is generated from include/lnmlp.h (tools/gen_bindings.py, whose CTest keeps it equal
    # to the header): every function it declares is exported by the loaded library, and _lib
    # declared each with the generated prototype.
    path = _lib.library_path()
    fresh = ctypes.CDLL(path)
    assert len(_capi.PROTOTYPES) >= 49
    missing = [n for n in _capi.PROTOTYPES if not hasattr(fresh, n)]
    assert not missing, f"{path} lacks {missing}"
    lib = _lib.get_lib()
    for name, (restype, argtypes) in _capi.PROTOTYPES.items():
        fn = getattr(lib, name)
        assert fn.restype is restype and list(fn.argtypes) == list(argtypes), name


def test_experimental_tier_is_listed():
    # The header's experimental tier (declared in C only with LNMLP_EXPERIMENTAL; exported always):
    # _capi.EXPERIMENTAL names it, and the binding still declares it.
    exp = _capi.EXPERIMENTAL
    assert {"lnmlp_desc_set_sharding", "lnmlp_desc_set_communicator", "lnmlp_comm_create_callbacks",
            "lnmlp_comm_create_mpi", "lnmlp_plan_export_state", "lnmlp_plan_import_state",
            "lnmlp_plan_get_state_bytes", "BACKEND_CUDA", "FEATURE_SHARDING"} <= exp
    assert not {"lnmlp_plan_forward", "lnmlp_plan_backward", "lnmlp_fp8_encode",
                "lnmlp_plan_get_quantizer_state", "BACKEND_CPU", "DTYPE_FP8_E4M3"} & exp
    assert all(hasattr(_capi, n) or n in _capi.PROTOTYPES for n in exp - {"lnmlp_comm", "lnmlp_comm_fn"})
    # ABI 2 renamed the FP8 element formats into the DTYPE enum and dropped LNMLP_COMM_*.
    assert (_capi.DTYPE_U8, _capi.DTYPE_FP8_E4M3, _capi.DTYPE_FP8_E5M2) == (3, 4, 5)
    for gone in ("FP8_E4M3", "FP8_E5M2", "COMM_F32", "COMM_BF16", "COMM_F16", "COMM_U8"):
        assert not hasattr(_capi, gone), gone


def _needed(library):
    """The DT_NEEDED entries of a shared library (readelf -d)."""
    out = subprocess.run(["readelf", "-d", library], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def test_mpi_is_a_module_the_core_loads_only_when_asked(tmp_path):
    """liblnmlp links no MPI, nor does its MPI module: lnmlp_comm_create_mpi loads the build's MPI
    library into the global scope and then liblnmlp_mpi.so.1 (beside the library), whose MPI
    symbols resolve there, when called. Without the module (the core copied alone), it fails with
    NOT_SUPPORTED naming the module, and everything else still works."""
    core = lnmlp.library_path()
    assert not [n for n in _needed(core) if "mpi" in n], _needed(core)
    module = os.path.join(os.path.dirname(core), "liblnmlp_mpi.so.1")
    if "MPI communicator: built" in lnmlp.build_info():
        assert not [n for n in _needed(module) if "mpi" in n], _needed(module)
        undefined = subprocess.run(["nm", "-D", "--undefined-only", module], capture_output=True, text=True,
                                   check=True).stdout
        assert "MPI_Allreduce" in undefined, undefined
    alone = tmp_path / os.path.basename(core)
    alone.write_bytes(open(core, "rb").read())
    probe = (
        "import ctypes, lnmlp\n"
        "from lnmlp import _capi, _lib\n"
        "lib = _lib.get_lib()\n"
        "mpi_comm, comm = ctypes.c_void_p(1), ctypes.c_void_p()\n"
        "status = lib.lnmlp_comm_create_mpi(ctypes.byref(mpi_comm), ctypes.byref(comm))\n"
        "print(status == _capi.ERROR_NOT_SUPPORTED, not comm.value, lib.lnmlp_last_error().decode())\n"
        "with lnmlp.Plan(4, 8, 16) as p:\n"
        "    print('plan', p.hidden)\n")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(lnmlp.__file__)))
    env = dict(os.environ, LNMLP_LIBRARY=str(alone), PYTHONPATH=package_root)
    env.pop("LD_LIBRARY_PATH", None)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
    assert out.startswith("True True ") and "liblnmlp_mpi.so.1" in out or "no MPI module" in out, out
    assert "plan 8" in out, out


def test_the_cuda_module_finds_cublaslt_in_nvidias_pip_wheel(tmp_path):
    """In a wheel the CUDA module is site-packages/lnmlp/liblnmlp_cuda.so.1, and NVIDIA's pip wheel
    puts cuBLASLt in site-packages/nvidia/cu13/lib: the module's RUNPATH names that place first.
    Laid out so in a temporary folder (the wheel's cuBLASLt linked in from wherever this machine
    has one), the loader resolves the module's libcublasLt.so.13 there."""
    module = os.path.join(os.path.dirname(lnmlp.library_path()), "liblnmlp_cuda.so.1")
    if not os.path.exists(module):
        pytest.skip("this build has no CUDA module (no nvcc)")
    out = subprocess.run(["readelf", "-d", module], capture_output=True, text=True, check=True).stdout
    runpath = next(line for line in out.splitlines() if "RUNPATH" in line or "RPATH" in line)
    assert runpath.split("[", 1)[1].startswith("$ORIGIN/../nvidia/cu13/lib"), runpath
    cublas = next((line.split("=>")[1].split()[0] for line in subprocess.run(
        ["ldd", module], capture_output=True, text=True, check=True).stdout.splitlines()
        if "libcublasLt.so.13 =>" in line and "not found" not in line), None)
    if cublas is None:
        pytest.skip("no libcublasLt.so.13 on this machine to lay out")
    (tmp_path / "lnmlp").mkdir()
    (tmp_path / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    os.symlink(os.path.realpath(cublas), tmp_path / "nvidia" / "cu13" / "lib" / "libcublasLt.so.13")
    copy = tmp_path / "lnmlp" / "liblnmlp_cuda.so.1"  # a copy: $ORIGIN is a file's own folder
    copy.write_bytes(open(module, "rb").read())
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    resolved = subprocess.run(["ldd", str(copy)], capture_output=True, text=True, check=True, env=env).stdout
    assert f"{tmp_path}/lnmlp/../nvidia/cu13/lib/libcublasLt.so.13" in resolved, resolved


def test_comm_callbacks_table_needs_its_struct_size():
    # The raw ctypes layer: lnmlp_comm_create_callbacks reads struct_size first and refuses any
    # size but sizeof(lnmlp_comm_callbacks) (ctypes.sizeof of the generated Structure).
    lib = _lib.get_lib()
    size = ctypes.sizeof(_capi.lnmlp_comm_callbacks)
    assert size == 3 * 8 + 4 * ctypes.sizeof(ctypes.c_void_p) + ctypes.sizeof(ctypes.c_void_p)
    noop = _capi.LNMLP_COMM_FN(lambda send, recv, count, type_, user, stream: 0)

    def create(struct_size, group_size=1):
        table = _capi.lnmlp_comm_callbacks(struct_size=struct_size, group_size=group_size, rank=0,
                                           all_gather=noop, reduce_scatter=noop, all_reduce_sum=noop,
                                           all_reduce_max=noop, user=None)
        comm = ctypes.c_void_p()
        return lib.lnmlp_comm_create_callbacks(ctypes.byref(table), ctypes.byref(comm)), comm

    for bad in (0, -size, 16, size - 1, size + 1, size + 8, 1 << 40):
        status, comm = create(bad)
        assert status == _capi.ERROR_INVALID_ARGUMENT and not comm.value, bad
        assert "struct_size" in lib.lnmlp_last_error().decode(), bad
    status, comm = create(size, group_size=1 << 31)  # group_size is at most INT32_MAX
    assert status == _capi.ERROR_INVALID_ARGUMENT and not comm.value
    status, comm = create(size)
    assert status == _capi.SUCCESS and comm.value
    assert lib.lnmlp_comm_destroy(comm) == _capi.SUCCESS


def test_abi_mismatch_is_refused(monkeypatch):
    monkeypatch.setattr(_lib, "ABI_VERSION", 3)
    path = _lib.library_path()
    with pytest.raises(lnmlp.LibraryNotFoundError, match="ABI version 2.*needs ABI version 3"):
        _lib._declare(ctypes.CDLL(path), path)


def test_missing_library_is_a_clear_error():
    env = dict(os.environ, LNMLP_LIBRARY="/nonexistent/liblnmlp.so")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(lnmlp.__file__)))
    code = ("import lnmlp\ntry:\n    lnmlp.build_info()\nexcept lnmlp.LibraryNotFoundError as e:\n"
            "    print('OK', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=pkg, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.startswith("OK") and "LNMLP_LIBRARY" in out.stdout, out.stdout + out.stderr


# --- plan options -----------------------------------------------------------------------------------
def test_sizes(plan):
    e, A = 4, 1
    assert plan.saved_bytes_per_token == 8 + e * (H + A * F + F)
    assert plan.saved_bytes >= T * plan.saved_bytes_per_token
    assert plan.workspace_bytes >= 0 and plan.alignment == 64
    with lnmlp.Plan(T, H, F, norm_type="rmsnorm", dtype=ml_dtypes.bfloat16, remat="save_stats") as p:
        assert p.saved_bytes_per_token == 4
    with lnmlp.Plan(T, H, F, remat="forward_only") as p:
        assert p.saved_bytes == 0
        y, saved = fwd(p, arrays())
        assert saved is None
        with pytest.raises(lnmlp.Error):
            p.backward(y, arrays()["x"], *(arrays()[k] for k in ("gamma", "beta", "w1", "b1", "w2")), None)


def test_saved_buffer_is_aligned_and_realigned_copies_work(plan):
    a = arrays()
    y, saved = fwd(plan, a)
    assert saved.ctypes.data % plan.alignment == 0 and saved.nbytes == plan.saved_bytes
    args = (a["x"], a["gamma"], a["beta"], a["w1"], None, a["w2"])
    g1 = plan.backward(y, *args, saved)
    buf = np.empty(saved.nbytes + 1, np.uint8)
    off = 1 if buf.ctypes.data % 64 == 0 else 0
    mis = buf[off:off + saved.nbytes]
    mis[...] = saved
    g2 = plan.backward(y, *args, mis)
    for u, v in zip(g1, g2):
        assert (u is None and v is None) or np.array_equal(u, v)
    assert g1._asdict()["dw1"] is g1.dw1


@pytest.mark.parametrize("name,pair", [("geglu", ("gelu", "linear")), ("swiglu", ("silu", "linear")),
                                       ("reglu", ("relu", "linear")), ("qgeglu", ("quick_gelu", "linear")),
                                       ("sreglu", ("squared_relu", "linear")), ("glu", ("sigmoid", "linear"))])
def test_pair_names(name, pair):
    assert lnmlp.normalize_activations(name) == pair
    assert lnmlp.normalize_activations([name]) == pair
    with lnmlp.Plan(T, H, F, activation_type=name) as p:
        assert p.num_activations == 2 and p.activation_type == pair


def test_act_params_forms():
    acts = ("clamped_silu", "clamped_linear")
    a = arrays(A=2)

    class Params:  # any object with the attributes
        limit, alpha, offset = 2.0, 1.0, 0.0

    class TEParams:  # TransformerEngine's field names
        limit, alpha, glu_linear_offset = 2.0, 1.0, 0.0

    class Wrapped:  # the fields inside a clamped_swiglu attribute
        clamped_swiglu = TEParams()

    ys = []
    for ap in (None, {"limit": 2.0, "alpha": 1.0, "offset": 0.0}, Params(), lnmlp.ActParams(2.0, 1.0, 0.0),
               TEParams(), Wrapped(), {"limit": 2.0, "alpha": 1.0, "glu_linear_offset": 0.0}):
        with lnmlp.Plan(T, H, F, activation_type=acts, act_params=ap) as p:
            ys.append(fwd(p, a)[0])
    assert not np.array_equal(ys[0], ys[1])
    assert all(np.array_equal(ys[1], y) for y in ys[2:]), "every form gives the same parameters"
    with pytest.raises(lnmlp.InvalidArgumentError, match="none of the fields"):
        lnmlp.Plan(T, H, F, activation_type=acts, act_params=object())  # not silently the defaults
    with pytest.raises(lnmlp.InvalidArgumentError, match="two different offsets"):
        lnmlp.Plan(T, H, F, activation_type=acts, act_params={"offset": 0.0, "glu_linear_offset": 1.0})
    with pytest.raises(lnmlp.InvalidArgumentError, match="act_params applies only"):
        lnmlp.Plan(T, H, F, activation_type="relu", act_params={"limit": 2.0})
    with pytest.raises(lnmlp.InvalidArgumentError, match="unknown keys"):
        lnmlp.Plan(T, H, F, activation_type=acts, act_params={"limt": 2.0})
    with pytest.raises(lnmlp.InvalidArgumentError) as e:  # checked by the library
        lnmlp.Plan(T, H, F, activation_type=acts, act_params={"limit": -1.0})
    assert e.value.status == 1 and "limit" in e.value.message


@pytest.mark.parametrize("dtype", [np.float32, "float32", np.float16, "f16", ml_dtypes.bfloat16, "bfloat16"])
def test_dtype_spellings(dtype):
    with lnmlp.Plan(T, H, F, dtype=dtype) as p:
        assert p.dtype in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


# --- validation in Python -------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    (dict(activation_type="relux"), "unknown activation 'relux'"),
    (dict(activation_type=("relu", "relu", "relu")), "1 or 2 entries"),
    (dict(activation_type=()), "1 or 2 entries"),
    (dict(activation_type=(np.tanh,)), "callables are not supported"),
    (dict(norm_type="batchnorm"), "norm_type must be one of"),
    (dict(dtype=np.float64), "dtype must be"),
    (dict(remat="never"), "remat must be one of"),
    (dict(backend="tpu"), "backend must be one of"),
    (dict(gemm_math="tf16"), "gemm_math: unknown"),
    (dict(gemm_math=3), "gemm_math must be a name"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(lnmlp.InvalidArgumentError, match=match):
        lnmlp.Plan(T, H, F, **kwargs)


def test_gemm_math_is_exact_on_the_cpu():
    # The CPU backend has neither fast mode: a plan allowing both computes the exact plan's bits.
    a = arrays(A=2, bias1=True)
    with lnmlp.Plan(T, H, F, activation_type=("silu", "linear"), use_bias1=True) as exact, \
            lnmlp.Plan(T, H, F, activation_type=("silu", "linear"), use_bias1=True,
                       gemm_math=("TF32", "fp8_fast_accumulation")) as fast:
        assert fast.gemm_math == ("fp8_fast_accumulation", "tf32") and exact.gemm_math == ()
        np.testing.assert_array_equal(fwd(fast, a)[0], fwd(exact, a)[0])


def test_bad_shape_and_option_values_are_reported_by_the_library():
    for kwargs in (dict(epsilon=-1.0), dict(num_threads=-2), dict(activation_type=("clamped_silu", "linear"))):
        with pytest.raises(lnmlp.InvalidArgumentError) as e:
            lnmlp.Plan(T, H, F, **kwargs)
        assert e.value.status == 1 and e.value.status_name == "LNMLP_ERROR_INVALID_ARGUMENT"
        assert e.value.message
    with pytest.raises(lnmlp.Error) as e:
        lnmlp.Plan(0, H, F)
    assert "token" in e.value.message.lower()
    with pytest.raises(lnmlp.InvalidArgumentError, match="tokens must be an int"):
        lnmlp.Plan(6.0, H, F)


def test_size_overflow():
    with pytest.raises(lnmlp.SizeOverflowError) as e:
        lnmlp.Plan(2 ** 62, 2 ** 20, 2 ** 20)
    assert e.value.status == 3 and "overflows" in e.value.message
    assert isinstance(e.value, OverflowError)


def test_cuda_backend_not_supported_in_this_build():
    with pytest.raises(lnmlp.NotSupportedError) as e:
        lnmlp.Plan(T, H, F, backend="cuda")
    assert e.value.status == 5 and "CUDA" in e.value.message
    assert isinstance(e.value, NotImplementedError)


@pytest.mark.parametrize("name", ["x", "gamma", "beta", "w1", "w2"])
def test_wrong_dtype_names_the_argument(plan, name):
    a = arrays()
    with pytest.raises(lnmlp.InvalidArgumentError, match=f"^{name} has dtype float64, but the plan's dtype is float32"):
        fwd(plan, a, **{name: a[name].astype(np.float64)})
    with pytest.raises(lnmlp.InvalidArgumentError, match=f"^{name} has dtype float16"):
        fwd(plan, a, **{name: a[name].astype(np.float16)})


@pytest.mark.parametrize("name,bad", [("x", (6, 9)), ("x", ()), ("gamma", (9,)), ("beta", (8, 1)),
                                      ("w1", (8, 12)), ("w1", (8, 2, 12)), ("w2", (8, 12))])
def test_wrong_shape_names_the_argument(plan, name, bad):
    a = arrays()
    with pytest.raises(lnmlp.InvalidArgumentError, match=f"^{name} has shape"):
        fwd(plan, a, **{name: np.zeros(bad, np.float32)})


def test_non_contiguous_and_non_array(plan):
    a = arrays()
    with pytest.raises(lnmlp.InvalidArgumentError, match="^w1 is not C-contiguous"):
        fwd(plan, a, w1=np.asfortranarray(a["w1"]))
    with pytest.raises(lnmlp.InvalidArgumentError, match="^gamma is not C-contiguous"):
        fwd(plan, a, gamma=np.zeros(2 * H, np.float32)[::2])
    with pytest.raises(lnmlp.InvalidArgumentError, match="^gamma must be a numpy.ndarray"):
        fwd(plan, a, gamma=[1.0] * H)


def test_beta_and_bias_mismatches():
    a = arrays(norm="rmsnorm")
    with lnmlp.Plan(T, H, F, norm_type="rmsnorm") as p:
        with pytest.raises(lnmlp.InvalidArgumentError, match="beta was given, but rmsnorm has no beta"):
            fwd(p, a, beta=a["gamma"])
        with pytest.raises(lnmlp.InvalidArgumentError, match="^b1 was given"):
            fwd(p, a, b1=np.zeros((1, F), np.float32))
        with pytest.raises(lnmlp.InvalidArgumentError, match="^b2 was given"):
            fwd(p, a, b2=np.zeros(H, np.float32))
    with lnmlp.Plan(T, H, F) as p:
        with pytest.raises(lnmlp.NullPointerError, match="^beta is None"):
            fwd(p, arrays(), beta=None)
    with lnmlp.Plan(T, H, F, use_bias1=True, use_bias2=True) as p:
        with pytest.raises(lnmlp.NullPointerError, match="^b1 is None"):
            fwd(p, arrays(bias2=True))
        with pytest.raises(lnmlp.NullPointerError, match="^b2 is None"):
            fwd(p, arrays(bias1=True))
        with pytest.raises(lnmlp.InvalidArgumentError, match="^b1 has shape"):
            fwd(p, arrays(bias1=True, bias2=True), b1=np.zeros((2, F), np.float32))


def test_backward_argument_checks():
    a = arrays(bias1=True)
    with lnmlp.Plan(T, H, F, use_bias1=True, remat="save_stats") as p:
        y, saved = fwd(p, a)
        args = [a["x"], a["gamma"], a["beta"], a["w1"], a["b1"], a["w2"]]
        p.backward(y, *args, saved)
        with pytest.raises(lnmlp.NullPointerError, match="^b1 is None.*save_stats"):
            p.backward(y, *args[:4], None, args[5], saved)
        with pytest.raises(lnmlp.InvalidArgumentError, match="^dy has shape"):
            p.backward(y.reshape(T, H), *args, saved)
        with pytest.raises(lnmlp.InvalidArgumentError, match="^saved has 3 bytes"):
            p.backward(y, *args, np.zeros(3, np.uint8))
        with pytest.raises(lnmlp.InvalidArgumentError, match="^saved must be"):
            p.backward(y, *args, saved.view(np.int8))
        with pytest.raises(lnmlp.NullPointerError, match="^saved is None"):
            p.backward(y, *args, None)


# --- lifetime -------------------------------------------------------------------------------------
class CountingDestroy:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, handle):
        self.calls += 1
        return self.fn(handle)


def test_close_is_idempotent_and_use_after_close_raises():
    p = lnmlp.Plan(T, H, F)
    counter = p._destroy_fn = CountingDestroy(p._destroy_fn)
    assert not p.closed
    p.close()
    p.close()
    assert p.closed and counter.calls == 1
    with pytest.raises(lnmlp.InvalidHandleError, match="closed"):
        fwd(p, arrays())
    with pytest.raises(lnmlp.InvalidHandleError):
        p.backward(*(None,) * 8)
    del p
    gc.collect()
    assert counter.calls == 1


def test_context_manager_closes():
    with lnmlp.Plan(T, H, F) as p:
        counter = p._destroy_fn = CountingDestroy(p._destroy_fn)
        fwd(p, arrays())
    assert p.closed and counter.calls == 1
    assert "[closed]" in repr(p)


def test_garbage_collection_frees_the_plan():
    p = lnmlp.Plan(T, H, F)
    counter = p._destroy_fn = CountingDestroy(p._destroy_fn)
    ref = weakref.ref(p)
    del p
    gc.collect()
    assert ref() is None and counter.calls == 1


def test_failed_construction_is_safe():
    with pytest.raises(lnmlp.Error):
        lnmlp.Plan(T, H, F, epsilon=float("nan"))
    gc.collect()


# --- device arrays (CUDA backend path) --------------------------------------------------------------
def test_device_array_parsing():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    ptr, shape, kind, dev = _plan.device_array_info("x", a)  # numpy speaks DLPack (host memory)
    assert ptr == a.ctypes.data and shape == (3, 4) and kind == ("dlpack", 2, 32) and dev == 1

    class FakeCuda:
        def __init__(self, arr, strides=None):
            self.__cuda_array_interface__ = dict(shape=arr.shape, typestr=arr.dtype.str,
                                                 data=(arr.ctypes.data, False), strides=strides, version=3)

    ptr, shape, kind, dev = _plan.device_array_info("x", FakeCuda(a))
    assert ptr == a.ctypes.data and shape == (3, 4) and kind == ("cai", "<f4") and dev == 2
    with pytest.raises(lnmlp.InvalidArgumentError, match="^x must be C-contiguous"):
        _plan.device_array_info("x", FakeCuda(a, strides=(4, 12)))
    with pytest.raises(lnmlp.InvalidArgumentError, match="CUDA device array"):
        _plan.device_array_info("x", object())
    with lnmlp.Plan(T, H, F) as p:  # a CPU plan refuses device arrays
        with pytest.raises(lnmlp.InvalidArgumentError, match="^gamma is a CUDA device array"):
            fwd(p, arrays(), gamma=FakeCuda(arrays()["gamma"]))


def test_errors_carry_status_and_names():
    for status, cls in _lib._ERROR_CLASSES.items():
        e = _lib.error_for(status, "msg")
        assert type(e) is cls and e.status == status and isinstance(e, lnmlp.Error)
        assert e.status_name == _lib.status_string(status) != "LNMLP_UNKNOWN_STATUS"
        assert e.message == "msg" and e.status_name in str(e)
    names = {"InvalidArgumentError", "NullPointerError", "SizeOverflowError", "InvalidHandleError",
             "NotSupportedError", "OutOfMemoryError", "WorkspaceTooSmallError", "NoWorkspaceError",
             "MisalignedError", "PlanBusyError", "BackendError", "InternalError"}
    assert names == {c.__name__ for c in _lib._ERROR_CLASSES.values()}
    assert all(hasattr(lnmlp, n) for n in names)


def test_threads_distinct_plans_and_one_shared_plan():
    import threading
    a = arrays()
    with lnmlp.Plan(T, H, F, num_threads=1) as shared:
        expected = fwd(shared, a)[0]
        results, errors = [], []

        def work(own):
            try:
                for _ in range(20):
                    results.append(fwd(own or shared, a)[0])
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)
            finally:
                if own is not None:
                    own.close()

        threads = [threading.Thread(target=work, args=(lnmlp.Plan(T, H, F, num_threads=1) if i % 2 else None,))
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors and len(results) == 80
    assert all(np.array_equal(r, expected) for r in results)


@pytest.mark.parametrize("kwargs, match", [
    (dict(tokens=2**64 + 8), r"tokens must be in \[-9223372036854775808, 9223372036854775807\]"),
    (dict(hidden=-(2**63) - 1), "hidden must be in"),
    (dict(num_threads=2**32), r"num_threads must be in \[0, 65536\]"),
    (dict(sharding=(2**64 + 1, 0, False)), "sharding's group_size must be in"),
])
def test_out_of_range_integers_are_refused_not_wrapped(kwargs, match):
    """ctypes wraps integers silently (2**64 + 8 reached the library as 8: an 8-token plan whose
    Plan.tokens said 2**64 + 8); the binding refuses them first."""
    args = dict(tokens=8, hidden=16, ffn=24)
    args.update({k: v for k, v in kwargs.items() if k in args})
    rest = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises(lnmlp.InvalidArgumentError, match=match):
        lnmlp.Plan(args["tokens"], args["hidden"], args["ffn"], **rest)
    with lnmlp.Plan(8, 16, 24) as p:
        with pytest.raises(lnmlp.InvalidArgumentError, match="tokens must be in"):
            p.tensor_shape("x", 2**64 + 1)


def test_a_thread_count_above_the_cores_runs():
    """num_threads=100000 used to end the interpreter (libgomp could not start the team); the
    library now runs such a plan on the cores the process may use."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w1 = rng.standard_normal((16, 1, 24)).astype(np.float32)
    w2 = rng.standard_normal((24, 16)).astype(np.float32)
    g, b = np.ones(16, np.float32), np.zeros(16, np.float32)
    with lnmlp.Plan(8, 16, 24, num_threads=65536) as many, lnmlp.Plan(8, 16, 24, num_threads=1) as one:
        np.testing.assert_allclose(many.forward(x, g, b, w1, None, w2, None)[0],
                                   one.forward(x, g, b, w1, None, w2, None)[0], rtol=1e-6, atol=1e-6)


def _forward_in_child(plan, inputs, conn):
    try:
        conn.send(plan.forward(*inputs)[0])
    finally:
        conn.close()


def test_a_forked_child_runs_after_the_parent_ran_threads():
    """multiprocessing's fork start method (DataLoader-style workers): the child's first forward,
    on the parent's plan, used to wait forever for the OpenMP threads a child does not have. It
    now runs on the child's one thread (bit for bit the parent's but where oneDNN's sgemm, below
    AVX-512, splits its sums by thread count)."""
    import multiprocessing
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one usable core: the parent starts no thread team")
    rng = np.random.default_rng(1)
    T, H, F = 64, 32, 48
    inputs = (rng.standard_normal((T, H)).astype(np.float32), np.ones(H, np.float32), np.zeros(H, np.float32),
              rng.standard_normal((H, 1, F)).astype(np.float32), None,
              rng.standard_normal((F, H)).astype(np.float32), None)
    ctx = multiprocessing.get_context("fork")
    with lnmlp.Plan(T, H, F, num_threads=2) as plan:
        expected = plan.forward(*inputs)[0]  # the parent runs a thread team first
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_forward_in_child, args=(plan, inputs, send))
        child.start()
        send.close()
        got = receive.recv() if receive.poll(60) else None
        child.join(10)
        if child.is_alive():
            child.kill()
        assert got is not None, "the forked child's forward did not finish within 60 s"
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_call_that_fails_while_running_says_the_callers_arrays_are_undefined():
    """lnmlp.h, "A call that fails": after OUT_OF_MEMORY, BACKEND or INTERNAL the outputs are
    undefined (an accumulating gradient may hold part of the sum); every other failure changed
    nothing. The error raised where the caller's arrays were written says which is which."""
    for status in (_lib.ERROR_OUT_OF_MEMORY, _lib.ERROR_BACKEND, _lib.ERROR_INTERNAL):
        with pytest.raises(lnmlp.Error, match=r"grads \(the caller's arrays\) are undefined now") as e:
            _lib.check(status, outputs="grads")
        assert e.value.status == status
    for status in (_lib.ERROR_INVALID_ARGUMENT, _lib.ERROR_MISALIGNED, _lib.ERROR_PLAN_BUSY):
        with pytest.raises(lnmlp.Error) as e:
            _lib.check(status, outputs="grads")
        assert "undefined" not in str(e.value)
    with pytest.raises(lnmlp.OutOfMemoryError) as e:
        _lib.check(_lib.ERROR_OUT_OF_MEMORY)
    assert "undefined" not in str(e.value)

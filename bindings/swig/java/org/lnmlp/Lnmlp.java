package org.lnmlp;

/**
 * Library-wide helpers over {@link LnmlpNative}: versions, capabilities, FP8 conversions.
 * Constants (ACT_GELU, NORM_LAYERNORM, ERROR_*, ...) are on {@link LnmlpNativeConstants}; use
 * {@code import static org.lnmlp.LnmlpNativeConstants.*;}.
 *
 * <p>Experimental: {@link LnmlpNative} also wraps lnmlp.h's experimental tier (declared in C only
 * under LNMLP_EXPERIMENTAL): sharding ({@code desc_set_sharding}, FEATURE_SHARDING), communicators
 * ({@code comm_create_*}, {@code comm_destroy}, {@code desc_set_communicator}), the state blob
 * ({@code plan_get_state_bytes}, {@code plan_export_state}, {@code plan_import_state}) and
 * BACKEND_CUDA. They work and are tested, but may change in any release.
 */
public final class Lnmlp {
  private Lnmlp() {}

  /** {major, minor, patch, abi} of the loaded library. */
  public static int[] version() {
    return LnmlpNative.get_version();
  }

  /** "major.minor.patch" of the loaded library. */
  public static String versionString() {
    int[] v = version();
    return v[0] + "." + v[1] + "." + v[2];
  }

  /**
   * Throws an {@link LnmlpException} (NOT_SUPPORTED) when the loaded library's ABI version is not
   * the one this binding was generated for ({@code LnmlpNativeConstants.ABI_VERSION}).
   */
  public static void checkAbi() {
    int abi = version()[3];
    if (abi != LnmlpNativeConstants.ABI_VERSION) {
      throw new LnmlpException(LnmlpNativeConstants.ERROR_NOT_SUPPORTED,
          "the loaded liblnmlp has ABI version " + abi + ", but this Java binding was generated for "
              + LnmlpNativeConstants.ABI_VERSION);
    }
  }

  /** The build description (version, backends, GEMM library, threading). */
  public static String buildInfo() {
    return LnmlpNative.get_build_info();
  }

  /** Whether {@code backend} (BACKEND_*) can run {@code feature} (FEATURE_*) here, natively or
   * emulated (see {@link #support}). BACKEND_CUDA and FEATURE_SHARDING are experimental. */
  public static boolean supports(int backend, int feature) {
    return support(backend, feature) != LnmlpNativeConstants.UNSUPPORTED;
  }

  /** lnmlp_query_support's answer: UNSUPPORTED, SUPPORTED, or SUPPORTED_EMULATED (an FP8 recipe
   * whose quantized GEMMs are emulated exactly, e.g. every recipe on the CPU backend). */
  public static int support(int backend, int feature) {
    return LnmlpNative.query_support(backend, feature);
  }

  /** fp8(in[i] * scale) for every element; dtype DTYPE_FP8_E4M3 or DTYPE_FP8_E5M2 (an element
   * type, not an FP8_FORMAT_* recipe choice: those are refused with ERROR_INVALID_ARGUMENT). */
  public static byte[] fp8Encode(int dtype, float[] in, float scale) {
    byte[] out = new byte[in.length];
    LnmlpNative.fp8_encode(dtype, in, scale, out);
    return out;
  }

  /** float(in[i]) * scaleInv for every code; dtype DTYPE_FP8_E4M3 or DTYPE_FP8_E5M2. */
  public static float[] fp8Decode(int dtype, byte[] in, float scaleInv) {
    float[] out = new float[in.length];
    LnmlpNative.fp8_decode(dtype, in, scaleInv, out);
    return out;
  }
}

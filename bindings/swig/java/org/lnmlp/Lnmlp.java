package org.lnmlp;

/**
 * Library-wide helpers over {@link LnmlpNative}: versions, capabilities, FP8 conversions.
 * Constants (ACT_GELU, NORM_LAYERNORM, ERROR_*, ...) are on {@link LnmlpNativeConstants}; use
 * {@code import static org.lnmlp.LnmlpNativeConstants.*;}.
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

  /** Whether {@code backend} (BACKEND_*) can run {@code feature} (FEATURE_*) here. */
  public static boolean supports(int backend, int feature) {
    return LnmlpNative.query_support(backend, feature);
  }

  /** fp8(in[i] * scale) for every element; format FP8_E4M3 or FP8_E5M2. */
  public static byte[] fp8Encode(int format, float[] in, float scale) {
    byte[] out = new byte[in.length];
    LnmlpNative.fp8_encode(format, in, scale, out);
    return out;
  }

  /** float(in[i]) * scaleInv for every code. */
  public static float[] fp8Decode(int format, byte[] in, float scaleInv) {
    float[] out = new float[in.length];
    LnmlpNative.fp8_decode(format, in, scaleInv, out);
    return out;
  }
}

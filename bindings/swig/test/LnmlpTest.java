import static org.lnmlp.LnmlpNativeConstants.*;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Random;
import org.lnmlp.DescHandle;
import org.lnmlp.Lnmlp;
import org.lnmlp.LnmlpException;
import org.lnmlp.LnmlpNative;
import org.lnmlp.Plan;
import org.lnmlp.PlanHandle;

/** Tests of the SWIG/JNI binding (plain main; any failure throws and exits non-zero). */
public final class LnmlpTest {
  private static int checks;

  private static void check(boolean ok, String what) {
    if (!ok) throw new AssertionError("FAILED: " + what);
    checks++;
  }

  private interface Body {
    void run() throws Exception;
  }

  private static <T extends Throwable> T expect(Class<T> cls, Body body, String what) {
    try {
      body.run();
    } catch (Throwable t) {
      if (cls.isInstance(t)) {
        checks++;
        return cls.cast(t);
      }
      throw new AssertionError("FAILED: " + what + ": expected " + cls.getSimpleName() + ", got " + t, t);
    }
    throw new AssertionError("FAILED: " + what + ": expected " + cls.getSimpleName() + ", nothing thrown");
  }

  private static LnmlpException expectStatus(int status, String fragment, Body body, String what) {
    LnmlpException e = expect(LnmlpException.class, body, what);
    check(e.getStatus() == status, what + ": status " + e.getStatusName() + " (" + e.getStatus()
        + "), expected " + LnmlpNative.status_string(status) + "; message: " + e.getMessage());
    check(e.getStatusName().equals(LnmlpNative.status_string(status)), what + ": status name");
    check(fragment == null || e.getDetail().contains(fragment),
        what + ": message '" + e.getDetail() + "' lacks '" + fragment + "'");
    check(e.getMessage().startsWith(e.getStatusName() + ": "), what + ": getMessage format");
    return e;
  }

  private static float[] rand(Random r, int n, double scale, double offset) {
    float[] a = new float[n];
    for (int i = 0; i < n; i++) a[i] = (float) (offset + scale * (2 * r.nextDouble() - 1));
    return a;
  }

  /** One call's inputs with biases, [t, H] x and dy, drawn from r in one order. */
  private static final class Inputs {
    final float[] x, gamma, beta, w1, b1, w2, b2, dy;

    Inputs(Random r, int t, int H, int F) {
      x = rand(r, t * H, 1.5, 0.3);
      gamma = rand(r, H, 0.5, 1.0);
      beta = rand(r, H, 0.2, 0);
      w1 = rand(r, H * F, 0.3, 0);
      b1 = rand(r, F, 0.2, 0);
      w2 = rand(r, F * H, 0.3, 0);
      b2 = rand(r, H, 0.2, 0);
      dy = rand(r, t * H, 1.0, 0);
    }
  }

  /** max |got - ref| <= tol * max |ref|. */
  private static void close(String name, float[] got, double[] ref, double tol) {
    check(got.length == ref.length, name + ": length " + got.length + " vs " + ref.length);
    double maxRef = 0, maxErr = 0;
    for (int i = 0; i < ref.length; i++) {
      maxRef = Math.max(maxRef, Math.abs(ref[i]));
      maxErr = Math.max(maxErr, Math.abs(got[i] - ref[i]));
    }
    check(maxErr <= tol * maxRef + 1e-30,
        name + ": max error " + maxErr + " > " + tol + " * max|ref| " + maxRef);
    System.out.printf("  %-7s max|ref| %.3e  max err %.3e  (rel %.2e)%n", name, maxRef, maxErr,
        maxErr / maxRef);
  }

  // ---- version, constants, build info, fp8 conversions ----------------------------------------
  static void testVersion() {
    int[] v = LnmlpNative.get_version();
    check(v.length == 4, "get_version returns 4 ints");
    check(v[0] == VERSION_MAJOR && v[1] == VERSION_MINOR && v[2] == VERSION_PATCH,
        "version " + Arrays.toString(v) + " matches the header");
    check(v[3] == ABI_VERSION, "ABI version " + v[3] + " == " + ABI_VERSION);
    Lnmlp.checkAbi();
    String info = Lnmlp.buildInfo();
    check(info != null && !info.isEmpty(), "build info non-empty");
    check(LnmlpNative.status_string(ERROR_NULL_POINTER).equals("LNMLP_ERROR_NULL_POINTER"),
        "status_string");
    check(LnmlpNative.status_string(12345).equals("LNMLP_UNKNOWN_STATUS"), "unknown status");
    check(Lnmlp.supports(BACKEND_CPU, FEATURE_BACKEND), "CPU backend supported");
    check(Lnmlp.supports(BACKEND_CPU, FEATURE_DTYPE_F32), "CPU f32 supported");
    check(Lnmlp.support(BACKEND_CPU, FEATURE_DTYPE_F32) == SUPPORTED, "CPU f32: SUPPORTED");
    check(Lnmlp.support(BACKEND_CPU, FEATURE_RECIPE_DELAYED) == SUPPORTED_EMULATED
        && Lnmlp.supports(BACKEND_CPU, FEATURE_RECIPE_DELAYED), "CPU FP8 recipes: SUPPORTED_EMULATED");
    check(ACT_GELU == 2 && NORM_RMSNORM == 1 && QUANTIZER_COUNT == 6 && FP8_FORMAT_DEFAULT == -1
        && RECIPE_MXFP8 == 4 && FEATURE_EXTERNAL_WORKSPACE == 9, "enum constants");
    check(DTYPE_U8 == 3 && DTYPE_FP8_E4M3 == 4 && DTYPE_FP8_E5M2 == 5 && FP8_FORMAT_HYBRID == 0
        && FP8_FORMAT_E4M3 == 1, "element dtypes and recipe formats");
    // the experimental tier is wrapped (lnmlp.i defines LNMLP_EXPERIMENTAL)
    check(BACKEND_CUDA == 1 && FEATURE_SHARDING == 8, "experimental constants");
    expectStatus(ERROR_INVALID_ARGUMENT, null, () -> LnmlpNative.query_support(7, 0),
        "query_support with an unknown backend");

    byte[] codes = Lnmlp.fp8Encode(DTYPE_FP8_E4M3, new float[] {1.0f, -2.0f, 1000f, 0f}, 1.0f);
    check(codes[0] == 0x38 && codes[1] == (byte) 0xc0 && codes[2] == 0x7e && codes[3] == 0,
        "fp8 E4M3 encode: " + Arrays.toString(codes));
    float[] back = Lnmlp.fp8Decode(DTYPE_FP8_E4M3, codes, 2.0f);
    check(back[0] == 2f && back[1] == -4f && back[2] == 896f && back[3] == 0f,
        "fp8 E4M3 decode: " + Arrays.toString(back));
    codes = Lnmlp.fp8Encode(DTYPE_FP8_E5M2, new float[] {1.0f, -2.0f, 1e6f, 0f}, 1.0f);
    check(codes[0] == 0x3c && codes[1] == (byte) 0xc0 && codes[2] == 0x7b && codes[3] == 0,
        "fp8 E5M2 encode: " + Arrays.toString(codes));
    back = Lnmlp.fp8Decode(DTYPE_FP8_E5M2, codes, 0.5f);
    check(back[0] == 0.5f && back[1] == -1f && back[2] == 28672f && back[3] == 0f,
        "fp8 E5M2 decode: " + Arrays.toString(back));
    // the old element numbers (0, 1) are recipe formats now, not element types: refused
    for (int wrong : new int[] {FP8_FORMAT_HYBRID, FP8_FORMAT_E4M3, DTYPE_F32, DTYPE_U8}) {
      expectStatus(ERROR_INVALID_ARGUMENT, null,
          () -> Lnmlp.fp8Encode(wrong, new float[] {1f}, 1f), "fp8_encode with dtype " + wrong);
      expectStatus(ERROR_INVALID_ARGUMENT, null,
          () -> Lnmlp.fp8Decode(wrong, new byte[] {0x38}, 1f), "fp8_decode with dtype " + wrong);
    }
    expect(IllegalArgumentException.class,
        () -> LnmlpNative.fp8_encode(DTYPE_FP8_E4M3, new float[4], 1f, new byte[3]),
        "fp8_encode with a short output array");
    expectStatus(ERROR_INVALID_ARGUMENT, "scale",
        () -> LnmlpNative.fp8_encode(DTYPE_FP8_E4M3, new float[4], 0f, new byte[4]), "fp8 scale 0");
    // NVFP4: global amax 2688 gives the global scale 1, a block maximum of 6 the E4M3 scale 1.0
    // (0x38), so the elements are cast as they are (ties to even, saturating at 6).
    // 6.3 saturates to 6, and 6.3 / 6 still rounds to 1.0 in E4M3.
    float[] x = new float[16];
    x[0] = 6f; x[1] = 0.25f; x[2] = 0.75f; x[3] = 2.5f; x[4] = -3f; x[5] = 6.3f;
    byte[] fp4 = new byte[8];
    byte[] fp4Scales = new byte[1];
    float[] values = new float[16];
    LnmlpNative.nvfp4_quantize(x, 1, 16, 1, 2688f, fp4, fp4Scales);
    check(fp4Scales[0] == 0x38 && fp4[0] == 0x07 && fp4[1] == 0x42 && fp4[2] == (byte) 0x7d,
        "nvfp4 codes: " + Arrays.toString(fp4));
    LnmlpNative.nvfp4_dequantize(fp4, fp4Scales, 1, 16, 2688f, values);
    check(values[0] == 6f && values[1] == 0f && values[2] == 1f && values[3] == 2f && values[4] == -3f
        && values[5] == 6f, "nvfp4 dequantize: " + Arrays.toString(values));
    expect(IllegalArgumentException.class,
        () -> LnmlpNative.nvfp4_quantize(new float[16], 1, 16, 1, 1f, new byte[7], new byte[1]),
        "nvfp4_quantize with a short codes array");
    expect(IllegalArgumentException.class,
        () -> LnmlpNative.nvfp4_dequantize(new byte[8], new byte[1], 1, 16, 1f, new float[15]),
        "nvfp4_dequantize with a short values array");
    expectStatus(ERROR_INVALID_ARGUMENT, "block_rows",
        () -> LnmlpNative.nvfp4_quantize(new float[16], 1, 16, 8, 1f, new byte[8], new byte[1]),
        "nvfp4_quantize with block_rows 8");
    System.out.println("version " + Lnmlp.versionString() + " abi " + v[3] + ": ok");
  }

  // ---- f32 forward / backward against a double reference ----------------------------------------
  static double gelu(double x) {
    double c = Math.sqrt(2 / Math.PI);
    return 0.5 * x * (1 + Math.tanh(c * (x + 0.044715 * x * x * x)));
  }

  static double dgelu(double x) {
    double c = Math.sqrt(2 / Math.PI);
    double t = Math.tanh(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
  }

  /** A row-major [rows, cols] matrix transposed into [cols, rows]. */
  static float[] transposed(float[] v, int rows, int cols) {
    float[] t = new float[v.length];
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) t[c * rows + r] = v[r * cols + c];
    return t;
  }

  static void testForwardBackward() {
    final int T = 12, H = 32, F = 48;
    final float eps = 1e-5f;
    Random r = new Random(1234);
    float[] x = rand(r, T * H, 1.5, 0.3), gamma = rand(r, H, 0.5, 1.0), beta = rand(r, H, 0.2, 0);
    float[] w1 = rand(r, H * F, 0.3, 0), b1 = rand(r, F, 0.2, 0);
    float[] w2 = rand(r, F * H, 0.3, 0), b2 = rand(r, H, 0.2, 0);
    float[] dy = rand(r, T * H, 1.0, 0);

    // double-precision reference
    double[] n = new double[T * H], xhat = new double[T * H], rstd = new double[T];
    double[] h = new double[T * F], a = new double[T * F], y = new double[T * H];
    for (int t = 0; t < T; t++) {
      double mu = 0, var = 0;
      for (int k = 0; k < H; k++) mu += x[t * H + k];
      mu /= H;
      for (int k = 0; k < H; k++) var += (x[t * H + k] - mu) * (x[t * H + k] - mu);
      var /= H;
      rstd[t] = 1 / Math.sqrt(var + eps);
      for (int k = 0; k < H; k++) {
        xhat[t * H + k] = (x[t * H + k] - mu) * rstd[t];
        n[t * H + k] = xhat[t * H + k] * gamma[k] + beta[k];
      }
      for (int f = 0; f < F; f++) {
        double s = b1[f];
        for (int k = 0; k < H; k++) s += n[t * H + k] * w1[k * F + f];
        h[t * F + f] = s;
        a[t * F + f] = gelu(s);
      }
      for (int j = 0; j < H; j++) {
        double s = b2[j];
        for (int f = 0; f < F; f++) s += a[t * F + f] * w2[f * H + j];
        y[t * H + j] = s;
      }
    }
    double[] dw2 = new double[F * H], db2 = new double[H], dw1 = new double[H * F];
    double[] db1 = new double[F], dgamma = new double[H], dbeta = new double[H];
    double[] dx = new double[T * H];
    for (int t = 0; t < T; t++) {
      double[] dh = new double[F];
      for (int f = 0; f < F; f++) {
        double da = 0;
        for (int j = 0; j < H; j++) {
          dw2[f * H + j] += a[t * F + f] * dy[t * H + j];
          da += dy[t * H + j] * w2[f * H + j];
        }
        dh[f] = da * dgelu(h[t * F + f]);
        db1[f] += dh[f];
      }
      double[] dxhat = new double[H];
      double m1 = 0, m2 = 0;
      for (int k = 0; k < H; k++) {
        double dn = 0;
        for (int f = 0; f < F; f++) {
          dw1[k * F + f] += n[t * H + k] * dh[f];
          dn += dh[f] * w1[k * F + f];
        }
        dgamma[k] += dn * xhat[t * H + k];
        dbeta[k] += dn;
        dxhat[k] = dn * gamma[k];
        m1 += dxhat[k];
        m2 += dxhat[k] * xhat[t * H + k];
      }
      m1 /= H;
      m2 /= H;
      for (int k = 0; k < H; k++) {
        dx[t * H + k] = rstd[t] * (dxhat[k] - m1 - xhat[t * H + k] * m2);
      }
      for (int j = 0; j < H; j++) db2[j] += dy[t * H + j];
    }

    final double tol = 1e-5;
    for (int remat : new int[] {REMAT_SAVE_ALL, REMAT_SAVE_STATS}) {
      System.out.println("f32 layernorm+gelu+biases, T=" + T + " H=" + H + " F=" + F
          + (remat == REMAT_SAVE_ALL ? " SAVE_ALL" : " SAVE_STATS") + ":");
      try (Plan plan = Plan.builder(T, H, F).norm(NORM_LAYERNORM).epsilon(eps)
               .activations(ACT_GELU).bias(true, true).remat(remat).numThreads(2).build()) {
        check(plan.savedBytes() > 0 && plan.alignment() >= 64, "saved bytes / alignment");
        check(plan.stateBytes() == 0 && plan.amaxHistoryLength() == 0, "no FP8 state");
        ByteBuffer saved = plan.newSavedBuffer();
        float[] yOut = plan.forward(x, gamma, beta, w1, b1, w2, b2, saved);
        close("y", yOut, y, tol);
        Plan.Grads g = plan.backward(dy, x, gamma, beta, w1, b1, w2, saved);
        close("dW2", g.dw2, dw2, tol);
        close("db2", g.db2, db2, tol);
        close("dW1", g.dw1, dw1, tol);
        close("db1", g.db1, db1, tol);
        close("dgamma", g.dgamma, dgamma, tol);
        close("dbeta", g.dbeta, dbeta, tol);
        close("dx", g.dx, dx, tol);
      }
    }

    // PyTorch's out x in weights (W1 [F, H], W2 [H, F]) and their gradients: the same block
    System.out.println("f32 layernorm+gelu+biases, weights out x in (WEIGHT_LAYOUT_OUT_IN):");
    try (Plan plan = Plan.builder(T, H, F).norm(NORM_LAYERNORM).epsilon(eps).activations(ACT_GELU)
             .bias(true, true).weightLayout(WEIGHT_LAYOUT_OUT_IN).numThreads(2).build()) {
      check(plan.weightLayout() == WEIGHT_LAYOUT_OUT_IN, "weightLayout()");
      float[] w1t = transposed(w1, H, F), w2t = transposed(w2, F, H);
      ByteBuffer saved = plan.newSavedBuffer();
      close("y", plan.forward(x, gamma, beta, w1t, b1, w2t, b2, saved), y, tol);
      Plan.Grads g = plan.backward(dy, x, gamma, beta, w1t, b1, w2t, saved);
      close("dW1", transposed(g.dw1, F, H), dw1, tol);
      close("dW2", transposed(g.dw2, H, F), dw2, tol);
      close("dx", g.dx, dx, tol);
    }
    expectStatus(ERROR_INVALID_ARGUMENT, "layout",
        () -> Plan.builder(T, H, F).weightLayout(2).build(), "weight layout 2");

    // the raw calls, with an external workspace
    DescHandle d = LnmlpNative.desc_create();
    PlanHandle p;
    try {
      LnmlpNative.desc_set_shape(d, T, H, F);
      LnmlpNative.desc_set_epsilon(d, eps);
      LnmlpNative.desc_set_activations(d, new int[] {ACT_GELU});
      LnmlpNative.desc_set_bias(d, 1, 1);
      LnmlpNative.desc_set_external_workspace(d, 1);
      p = LnmlpNative.plan_create(d);
    } finally {
      LnmlpNative.desc_destroy(d);
    }
    try {
      long align = LnmlpNative.plan_get_alignment(p);
      ByteBuffer saved = Plan.allocateAligned(LnmlpNative.plan_get_saved_bytes(p), align);
      float[] yOut = new float[T * H];
      expectStatus(ERROR_NO_WORKSPACE, null,
          () -> LnmlpNative.plan_forward(p, T, x, gamma, beta, w1, b1, w2, b2, yOut, saved, null,
              CALL_DEFAULT, 0),
          "forward before attaching workspace");
      long ws = LnmlpNative.plan_get_workspace_bytes(p);
      LnmlpNative.plan_attach_workspace(p, Plan.allocateAligned(Math.max(ws, 1), align));
      LnmlpNative.plan_forward(p, T, x, gamma, beta, w1, b1, w2, b2, yOut, saved, null, CALL_DEFAULT, 0);
      System.out.println("raw LnmlpNative calls, external workspace (" + ws + " bytes):");
      close("y", yOut, y, tol);
    } finally {
      LnmlpNative.plan_destroy(p);
    }
  }

  // ---- errors -----------------------------------------------------------------------------------
  static void testErrors() {
    DescHandle d = LnmlpNative.desc_create();
    try {
      LnmlpException e = expectStatus(ERROR_INVALID_ARGUMENT, null,
          () -> LnmlpNative.desc_set_shape(d, 0, 8, 8), "tokens = 0");
      check(e.getDetail().equals(LnmlpNative.last_error()), "detail is lnmlp_last_error()");
      check(!e.getDetail().isEmpty(), "a message is given");
      expectStatus(ERROR_INVALID_ARGUMENT, null,
          () -> LnmlpNative.desc_set_activations(d, new int[] {ACT_GELU, ACT_LINEAR, ACT_RELU}),
          "three activations");
      expectStatus(ERROR_INVALID_ARGUMENT, null, () -> LnmlpNative.desc_set_norm(d, 9), "norm 9");
      // int64_t arguments reach C whole: 2^32 + k would be k if cut to 32 bits
      final long big = 1L << 32;
      LnmlpNative.desc_set_num_threads(d, 2L);
      expectStatus(ERROR_INVALID_ARGUMENT, "num_threads",
          () -> LnmlpNative.desc_set_num_threads(d, big), "num_threads 2^32");
      LnmlpNative.desc_set_delayed_scaling(d, 0, 4L, AMAX_ALGO_MAX);
      expectStatus(ERROR_INVALID_ARGUMENT, "amax_history_len",
          () -> LnmlpNative.desc_set_delayed_scaling(d, 0, big + 4, AMAX_ALGO_MAX), "history 2^32 + 4");
      // experimental: sharding takes int64_t group_size and rank (at most INT32_MAX)
      LnmlpNative.desc_set_sharding(d, 2L, 1L, 0);
      expectStatus(ERROR_INVALID_ARGUMENT, "group_size",
          () -> LnmlpNative.desc_set_sharding(d, big + 2, 1L, 0), "group_size 2^32 + 2");
      expectStatus(ERROR_INVALID_ARGUMENT, "rank",
          () -> LnmlpNative.desc_set_sharding(d, 2L, big + 1, 0), "rank 2^32 + 1");
      LnmlpNative.desc_set_sharding(d, 1L, 0L, 0);
      expectStatus(ERROR_NULL_POINTER, null, () -> LnmlpNative.comm_create_callbacks(null),
          "comm_create_callbacks(null)");
      expectStatus(ERROR_NULL_POINTER, null, () -> LnmlpNative.plan_create(null), "plan_create(null)");
    } finally {
      LnmlpNative.desc_destroy(d);
    }
    System.out.println("error: " + LnmlpNative.last_error());

    final int T = 4, H = 8, F = 16;
    try (Plan plan = Plan.builder(T, H, F).activations(ACT_GELU).bias(true, true).build()) {
      float[] x = new float[T * H], g = new float[H], b = new float[H], w1 = new float[H * F];
      float[] b1 = new float[F], w2 = new float[F * H], b2 = new float[H], y = new float[T * H];
      ByteBuffer saved = plan.newSavedBuffer();
      LnmlpException e = expectStatus(ERROR_NULL_POINTER, "x",
          () -> LnmlpNative.plan_forward(plan.handle(), T, null, g, b, w1, b1, w2, b2, y, saved, null,
              CALL_DEFAULT, 0),
          "forward with x = null");
      System.out.println("error: " + e.getMessage());
      expectStatus(ERROR_NULL_POINTER, "b1",
          () -> plan.forward(x, g, b, w1, null, w2, b2, y, saved), "forward without b1 when enabled");
      expectStatus(ERROR_INVALID_ARGUMENT, "x has 5 elements",
          () -> plan.forward(new float[5], g, b, w1, b1, w2, b2, saved), "Plan checks lengths");
      expect(IllegalArgumentException.class,
          () -> LnmlpNative.plan_forward(plan.handle(), T, x, g, b, w1, b1, w2, b2, y,
              ByteBuffer.allocate(4096), null, CALL_DEFAULT, 0), "a heap ByteBuffer as saved");
      expectStatus(ERROR_INVALID_ARGUMENT, "flags",
          () -> LnmlpNative.plan_forward(plan.handle(), T, x, g, b, w1, b1, w2, b2, y, saved, null,
              2, 0), "forward with flags 2 (no such flag)");
      expectStatus(ERROR_INVALID_ARGUMENT, "fp8_state",
          () -> plan.forward(x, g, b, w1, b1, w2, b2, y, saved, new float[6 * 5]),
          "fp8State for a plan without FP8 state");
      expectStatus(ERROR_INVALID_ARGUMENT, null, () -> plan.amaxHistory(QUANTIZER_W1),
          "quantizer state of a non-FP8 plan");
      plan.close();
      plan.close(); // idempotent
      check(plan.isClosed(), "closed");
      expectStatus(ERROR_INVALID_HANDLE, "closed",
          () -> plan.forward(x, g, b, w1, b1, w2, b2, saved), "forward after close");
    }
  }

  // ---- FP8 delayed scaling state ----------------------------------------------------------------
  static void testDelayedState() {
    check(Lnmlp.supports(BACKEND_CPU, FEATURE_RECIPE_DELAYED), "CPU supports DELAYED");
    final int T = 16, H = 32, F = 64, HIST = 8;
    Random r = new Random(7);
    float[] x = rand(r, T * H, 2, 0), g = rand(r, H, 0.5, 1), b = rand(r, H, 0.1, 0);
    float[] w1 = rand(r, H * F, 0.2, 0), w2 = rand(r, F * H, 0.2, 0), dy = rand(r, T * H, 1, 0);
    Plan.Builder builder = Plan.builder(T, H, F).activations(ACT_GELU).recipe(RECIPE_DELAYED)
        .delayedScaling(0, HIST, AMAX_ALGO_MAX);
    try (Plan p1 = builder.build(); Plan p2 = builder.build()) {
      long histLen = LnmlpNative.plan_get_amax_history_length(p1.handle()); // int64_t* out
      check(histLen == HIST && p1.amaxHistoryLength() == HIST, "history length " + histLen);
      check(p1.stateBytes() > 0, "state bytes " + p1.stateBytes());
      ByteBuffer saved = p1.newSavedBuffer();
      for (int step = 0; step < 3; step++) {
        p1.forward(x, g, b, w1, null, w2, null, saved);
        p1.backward(dy, x, g, b, w1, null, w2, saved);
      }
      for (int q = 0; q < QUANTIZER_COUNT; q++) {
        float[] hist = p1.amaxHistory(q);
        check(hist.length == HIST && hist[0] > 0 && hist[2] > 0 && hist[3] == 0,
            "quantizer " + q + " history after 3 steps: " + Arrays.toString(hist));
        check(p1.quantizerScale(q) > 0 && p1.quantizerScale(q) != 1.0f,
            "quantizer " + q + " scale updated: " + p1.quantizerScale(q));
      }
      byte[] blob = p1.exportState();
      check(blob.length == p1.stateBytes(), "blob size");
      check(new String(blob, 0, 8, StandardCharsets.US_ASCII).equals("LNMLPQS1"), "blob magic");
      check(!Arrays.equals(blob, p2.exportState()), "a fresh plan's state differs");

      p2.importState(blob);
      check(Arrays.equals(blob, p2.exportState()), "export(import(blob)) == blob");
      for (int q = 0; q < QUANTIZER_COUNT; q++) {
        check(Float.floatToIntBits(p1.quantizerScale(q)) == Float.floatToIntBits(p2.quantizerScale(q))
            && Arrays.equals(p1.amaxHistory(q), p2.amaxHistory(q)), "quantizer " + q + " restored");
      }
      // same state + same inputs -> same FP8 result, bit for bit
      float[] y1 = p1.forward(x, g, b, w1, null, w2, null, saved);
      float[] y2 = p2.forward(x, g, b, w1, null, w2, null, p2.newSavedBuffer());
      check(Arrays.equals(y1, y2), "forward after import matches the exporting plan");

      // a bad blob is rejected and changes nothing
      byte[] before = p2.exportState();
      expectStatus(ERROR_INVALID_ARGUMENT, null,
          () -> p2.importState(Arrays.copyOf(blob, blob.length - 4)), "truncated blob");
      byte[] bad = blob.clone();
      bad[0] = 'X';
      expectStatus(ERROR_INVALID_ARGUMENT, null, () -> p2.importState(bad), "bad magic");
      check(Arrays.equals(before, p2.exportState()), "rejected imports change nothing");

      // per-quantizer set/get
      float[] hist = new float[HIST];
      Arrays.fill(hist, 3.5f);
      p2.setQuantizerState(QUANTIZER_DY, 0.25f, hist);
      check(p2.quantizerScale(QUANTIZER_DY) == 0.25f && Arrays.equals(p2.amaxHistory(QUANTIZER_DY), hist),
          "set_quantizer_state round-trip");
      expectStatus(ERROR_INVALID_ARGUMENT, null,
          () -> p2.setQuantizerState(QUANTIZER_DY, 1f, new float[HIST - 1]), "wrong history length");
      System.out.println("FP8 delayed: state of " + blob.length + " bytes exported, imported, identical");
    }
  }

  // ---- each call's own tokens (ABI 2): t < max, t = 0, t > max ------------------------------------
  /** Bit-for-bit equality (NaN payloads and the sign of zero included). */
  private static boolean sameBits(float[] a, float[] b) {
    if (a == null || b == null) return a == b;
    if (a.length != b.length) return false;
    for (int i = 0; i < a.length; i++) {
      if (Float.floatToRawIntBits(a[i]) != Float.floatToRawIntBits(b[i])) return false;
    }
    return true;
  }

  private static boolean allZero(float[] a) {
    for (float v : a) {
      if (Float.floatToRawIntBits(v) != 0) return false;
    }
    return true;
  }

  // ---- integers out of range: refused with the binding's exception, never wrapped ---------------
  static void testNvfp4() {
    final int T = 32, H = 32, F = 64;
    Random r = new Random(11);
    float[] x = rand(r, T * H, 2, 0), g = rand(r, H, 0.5, 1), b = rand(r, H, 0.1, 0);
    float[] w1 = rand(r, H * F, 0.2, 0), w2 = rand(r, F * H, 0.2, 0), dy = rand(r, T * H, 1, 0);
    check(RECIPE_NVFP4 == 5 && FEATURE_RECIPE_NVFP4 == 10
            && Lnmlp.support(BACKEND_CPU, FEATURE_RECIPE_NVFP4) == SUPPORTED_EMULATED,
        "NVFP4 constants, support");
    Plan.Builder builder = Plan.builder(T, H, F).activations(ACT_GELU).recipe(RECIPE_NVFP4);
    try (Plan p = builder.build(); Plan rtne = builder.nvfp4Options(false, true, false).build();
         Plan plain = Plan.builder(T, H, F).activations(ACT_GELU).build()) {
      long seed = 0x8000000000000001L;  // above 2^63: the bits travel unchanged
      p.setRngState(seed, 3);
      ByteBuffer saved = p.newSavedBuffer();
      float[] y = p.forward(x, g, b, w1, null, w2, null, saved);
      Plan.Grads first = p.backward(dy, x, g, b, w1, null, w2, saved);
      check(Arrays.equals(p.rngState(), new long[] {seed, 4}),
          "a backward moves the offset on: " + Arrays.toString(p.rngState()));
      p.setRngState(seed, 3);
      Plan.Grads again = p.backward(dy, x, g, b, w1, null, w2, saved);
      check(Arrays.equals(first.dw1, again.dw1), "the same random state draws the same bits");
      p.setRngPlace(32, 128, 0, 1);  // further on in a whole tensor: other bits; placed back, the first
      p.setRngState(seed, 3);
      check(!Arrays.equals(first.dw1, p.backward(dy, x, g, b, w1, null, w2, saved).dw1), "a place draws its bits");
      p.setRngPlace(0, 0, 0, 1);
      p.setRngState(seed, 3);
      check(Arrays.equals(first.dw1, p.backward(dy, x, g, b, w1, null, w2, saved).dw1), "placed back");
      try {
        p.setRngPlace(0, 0, 0, 0);
        check(false, "ffnParts 0 accepted");
      } catch (LnmlpException e) {
        check(e.getMessage().contains("ffn_parts"), e.getMessage());
      }
      rtne.backward(dy, x, g, b, w1, null, w2, saved);
      check(Arrays.equals(rtne.rngState(), new long[] {0, 0}), "without stochastic rounding nothing is drawn");
      float[] y0 = plain.forward(x, g, b, w1, null, w2, null, plain.newSavedBuffer());
      double err = 0, max = 0;
      for (int i = 0; i < y.length; i++) {
        err = Math.max(err, Math.abs(y[i] - y0[i]));
        max = Math.max(max, Math.abs(y0[i]));
      }
      check(err > 0.02 * max && err < 0.5 * max, "NVFP4 y near the unquantized y: " + err / max);
    }
  }

  static void testOutOfRangeIntegers() {
    // Builder's long arguments reach C whole (int64_t): 2^32 + k is not k.
    final long big = 1L << 32;
    expectStatus(ERROR_INVALID_ARGUMENT, "num_threads",
        () -> Plan.builder(4, 8, 16).numThreads(big + 2).build(), "Builder.numThreads(2^32 + 2)");
    expectStatus(ERROR_INVALID_ARGUMENT, "amax_history_len",
        () -> Plan.builder(4, 8, 16).recipe(RECIPE_DELAYED).delayedScaling(0, big + 4, AMAX_ALGO_MAX).build(),
        "Builder.delayedScaling history 2^32 + 4");
    expectStatus(ERROR_INVALID_ARGUMENT, "tokens",
        () -> Plan.builder(Long.MIN_VALUE, 8, 16).build(), "Builder tokens Long.MIN_VALUE");
    // allocateAligned: bytes + alignment used to wrap (Long.MAX_VALUE + 64 < Integer.MAX_VALUE),
    // passing its check and failing later with an IllegalArgumentException of ByteBuffer.
    expectStatus(ERROR_SIZE_OVERFLOW, "do not fit", () -> Plan.allocateAligned(Long.MAX_VALUE, 64),
        "allocateAligned(Long.MAX_VALUE, 64)");
    expectStatus(ERROR_SIZE_OVERFLOW, "do not fit", () -> Plan.allocateAligned(100, Long.MAX_VALUE),
        "allocateAligned(100, Long.MAX_VALUE)");
    // Sizes that are not a multiple of the alignment: bytes + alignment was not always enough
    // (alignedSlice rounds both ends inwards), which limit(bytes) then refused.
    for (long n = 1; n <= 300; n += 13) {
      for (long a : new long[] {16, 64, 4096}) {
        check(Plan.allocateAligned(n, a).capacity() == n, "allocateAligned(" + n + ", " + a + ")");
      }
    }
    // A plan whose dx ([T, H], T*H > Integer.MAX_VALUE) no Java array holds: SIZE_OVERFLOW, not
    // Math.toIntExact's ArithmeticException. External workspace: the plan allocates nothing for T.
    try (Plan huge = Plan.builder(Integer.MAX_VALUE, 8, 8).externalWorkspace(true).build()) {
      expectStatus(ERROR_SIZE_OVERFLOW, "more than a Java array holds", () -> huge.newGrads(TOKENS_MAX),
          "newGrads of a plan whose dx exceeds a Java array");
      check(huge.newGrads(4).dx.length == 4 * 8, "newGrads for 4 tokens of that plan");
    }
    System.out.println("out-of-range integers: refused");
  }

  static void testTokens() {
    final int T = 12, H = 32, F = 48, t = 5;
    Random r = new Random(99);
    Inputs in = new Inputs(r, t, H, F);
    float[] x = in.x, gamma = in.gamma, beta = in.beta, w1 = in.w1, b1 = in.b1, w2 = in.w2, b2 = in.b2, dy = in.dy;
    // One thread, so that the plan for T and the plan for t sum in the same order: a call with t
    // tokens must give what the plan made for t tokens gives, bit for bit.
    try (Plan big = Plan.builder(T, H, F).activations(ACT_GELU).bias(true, true).numThreads(1).build();
         Plan small = Plan.builder(t, H, F).activations(ACT_GELU).bias(true, true).numThreads(1).build()) {
      // the shape query
      check(big.maxTokens() == T && small.maxTokens() == t, "maxTokens " + big.maxTokens());
      check(Arrays.equals(big.tensorShape(TENSOR_X), new long[] {T, H}), "x shape");
      check(Arrays.equals(big.tensorShape(TENSOR_Y, t), new long[] {t, H}), "y shape for t");
      check(Arrays.equals(big.tensorShape(TENSOR_W1), new long[] {H, 1, F}), "w1 shape");
      check(Arrays.equals(big.tensorShape(TENSOR_B1), new long[] {1, F}), "b1 shape");
      check(Arrays.equals(big.tensorShape(TENSOR_W2), new long[] {F, H}), "w2 shape");
      check(big.tensorShape(TENSOR_FP8_STATE) == null, "no FP8 state without DELAYED");
      int[] dtype = {-7};
      long[] savedT = LnmlpNative.plan_get_tensor_shape(big.handle(), TENSOR_SAVED, TOKENS_MAX, dtype);
      check(savedT.length == 1 && savedT[0] == big.savedBytes() && dtype[0] == DTYPE_U8,
          "saved shape " + Arrays.toString(savedT) + " dtype " + dtype[0]);
      long savedt = big.tensorShape(TENSOR_SAVED, t)[0];
      check(savedt < big.savedBytes() && big.newSavedBuffer(t).capacity() == savedt,
          "saved bytes for t = " + savedt + " < " + big.savedBytes());
      LnmlpNative.plan_get_tensor_shape(big.handle(), TENSOR_DW1, TOKENS_MAX, dtype);
      check(dtype[0] == DTYPE_F32, "dW1 dtype");
      expectStatus(ERROR_INVALID_ARGUMENT, "tokens must be in [0, " + T + "]",
          () -> big.tensorShape(TENSOR_X, T + 1), "shape query for T + 1 tokens");
      expect(IllegalArgumentException.class,
          () -> LnmlpNative.plan_get_tensor_shape(big.handle(), TENSOR_X, 1, new int[0]),
          "shape query with an empty dtype array");

      // t < max: the same bits as a plan made for t (saved buffers of the plan's most and of t)
      ByteBuffer savedBig = big.newSavedBuffer(), savedSmall = small.newSavedBuffer();
      float[] yBig = big.forward(x, gamma, beta, w1, b1, w2, b2, savedBig);
      float[] ySmall = small.forward(x, gamma, beta, w1, b1, w2, b2, savedSmall);
      check(yBig.length == t * H && sameBits(yBig, ySmall), "t < max: forward matches the t plan");
      Plan.Grads gBig = big.backward(dy, x, gamma, beta, w1, b1, w2, savedBig);
      Plan.Grads gSmall = small.backward(dy, x, gamma, beta, w1, b1, w2, savedSmall);
      check(gBig.dx.length == t * H && sameBits(gBig.dx, gSmall.dx), "t < max: dx");
      check(sameBits(gBig.dgamma, gSmall.dgamma) && sameBits(gBig.dbeta, gSmall.dbeta), "t < max: dgamma, dbeta");
      check(sameBits(gBig.dw1, gSmall.dw1) && sameBits(gBig.db1, gSmall.db1), "t < max: dW1, db1");
      check(sameBits(gBig.dw2, gSmall.dw2) && sameBits(gBig.db2, gSmall.db2), "t < max: dW2, db2");
      // the same through a saved buffer sized for t, and through the raw call
      ByteBuffer savedt5 = big.newSavedBuffer(t);
      check(sameBits(big.forward(x, gamma, beta, w1, b1, w2, b2, savedt5), ySmall), "saved sized for t");
      check(sameBits(big.backward(dy, x, gamma, beta, w1, b1, w2, savedt5).dw1, gSmall.dw1), "backward, saved for t");
      float[] yRaw = new float[t * H];
      LnmlpNative.plan_forward(big.handle(), t, x, gamma, beta, w1, b1, w2, b2, yRaw, savedBig, null,
          CALL_DEFAULT, 0);
      check(sameBits(yRaw, ySmall), "raw plan_forward with tokens = t");
      expectStatus(ERROR_INVALID_ARGUMENT, "saved has",
          () -> big.backward(rand(r, T * H, 1, 0), rand(r, T * H, 1, 0), gamma, beta, w1, b1, w2, savedt5),
          "a saved buffer for fewer tokens than the call");
      System.out.println("tokens: a call with t = " + t + " of T = " + T
          + " gives the t-token plan's bits (forward, backward; saved " + savedt + " bytes)");

      // t = 0: forward reads and writes nothing; backward's parameter gradients are zeros
      float[] empty = new float[0];
      float[] y0 = big.forward(empty, gamma, beta, w1, b1, w2, b2, big.newSavedBuffer(0));
      check(y0.length == 0, "t = 0: y is empty");
      Plan.Grads g0 = big.newGrads(0);
      for (float[] a : new float[][] {g0.dgamma, g0.dbeta, g0.dw1, g0.db1, g0.dw2, g0.db2}) Arrays.fill(a, Float.NaN);
      big.backward(empty, empty, gamma, beta, w1, b1, w2, big.newSavedBuffer(0), g0);
      check(g0.dx.length == 0, "t = 0: dx is empty");
      check(allZero(g0.dgamma) && allZero(g0.dbeta) && allZero(g0.dw1) && allZero(g0.db1)
          && allZero(g0.dw2) && allZero(g0.db2), "t = 0: the parameter gradients are written as zeros");
      // with 0 tokens the token-sized pointers may be NULL
      Plan.Grads g0raw = big.newGrads(0);
      Arrays.fill(g0raw.dw2, 1f);
      LnmlpNative.plan_forward(big.handle(), 0, null, gamma, beta, w1, b1, w2, b2, null, null, null, CALL_DEFAULT, 0);
      LnmlpNative.plan_backward(big.handle(), 0, null, null, gamma, beta, w1, b1, w2, null, null,
          g0raw.dgamma, g0raw.dbeta, g0raw.dw1, g0raw.db1, g0raw.dw2, g0raw.db2, null, CALL_DEFAULT, 0);
      check(allZero(g0raw.dw2), "t = 0 with NULL token tensors: dW2 zeros");
      check(sameBits(big.forward(x, gamma, beta, w1, b1, w2, b2, savedBig), ySmall),
          "empty calls change nothing for the next call");
      System.out.println("tokens: t = 0 gives empty outputs and zero parameter gradients");

      // t > max: the library refuses it, with its own message naming the plan's limit
      float[] xOver = rand(r, (T + 1) * H, 1, 0), dyOver = rand(r, (T + 1) * H, 1, 0);
      LnmlpException e = expectStatus(ERROR_INVALID_ARGUMENT, "tokens must be in [0, " + T + "]",
          () -> big.forward(xOver, gamma, beta, w1, b1, w2, b2, savedBig), "forward with T + 1 tokens");
      check(e.getDetail().startsWith("lnmlp_plan_forward:"), "the library's forward message: " + e.getDetail());
      System.out.println("error: " + e.getMessage());
      e = expectStatus(ERROR_INVALID_ARGUMENT, "tokens must be in [0, " + T + "]",
          () -> big.backward(dyOver, xOver, gamma, beta, w1, b1, w2, savedBig), "backward with T + 1 tokens");
      check(e.getDetail().startsWith("lnmlp_plan_backward:"), "the library's backward message: " + e.getDetail());
      expectStatus(ERROR_INVALID_ARGUMENT, "tokens must be in [0, " + T + "]",
          () -> LnmlpNative.plan_forward(big.handle(), T + 1, xOver, gamma, beta, w1, b1, w2, b2,
              new float[(T + 1) * H], savedBig, null, CALL_DEFAULT, 0), "raw forward with T + 1 tokens");
      expectStatus(ERROR_INVALID_ARGUMENT, "x has " + (H + 1) + " elements",
          () -> big.forward(new float[H + 1], gamma, beta, w1, b1, w2, b2, savedBig),
          "x not a whole number of tokens");
    }
  }

  // ---- FP8 state of the caller: per call, attached ------------------------------------------------
  static void testFp8StateOfCaller() {
    final int T = 8, H = 32, F = 64, HIST = 4;
    Random r = new Random(5);
    float[] x = rand(r, T * H, 2, 0), g = rand(r, H, 0.5, 1), b = rand(r, H, 0.1, 0);
    float[] w1 = rand(r, H * F, 0.2, 0), w2 = rand(r, F * H, 0.2, 0), dy = rand(r, T * H, 1, 0);
    Plan.Builder builder = Plan.builder(T, H, F).activations(ACT_GELU).recipe(RECIPE_DELAYED)
        .delayedScaling(0, HIST, AMAX_ALGO_MAX).numThreads(1);
    try (Plan p = builder.build(); Plan ref = builder.build()) {
      check(Arrays.equals(p.tensorShape(TENSOR_FP8_STATE), new long[] {QUANTIZER_COUNT, 1 + HIST}),
          "FP8 state shape " + Arrays.toString(p.tensorShape(TENSOR_FP8_STATE)));
      float[] st = p.newFp8State();
      check(st.length == QUANTIZER_COUNT * (1 + HIST) && st[0] == 1f && st[1] == 0f && st[1 + HIST] == 1f,
          "fresh state: scales 1, histories 0");
      byte[] own = p.exportState();
      ByteBuffer saved = p.newSavedBuffer();
      float[] y = new float[T * H];
      p.forward(x, g, b, w1, null, w2, null, y, saved, st);
      check(st[1] > 0 && st[0] != 1f, "forward recorded LN_OUT's amax and updated its scale in the caller's state");
      check(st[QUANTIZER_DY * (1 + HIST) + 1] == 0f, "DY is backward's");
      check(Arrays.equals(own, p.exportState()), "the plan's own state is untouched");
      Plan.Grads gr = p.newGrads(T);
      p.backward(dy, x, g, b, w1, null, w2, saved, gr, st);
      check(st[QUANTIZER_DY * (1 + HIST) + 1] > 0 && st[QUANTIZER_DH * (1 + HIST) + 1] > 0,
          "backward recorded DY and DH in the caller's state");
      check(Arrays.equals(own, p.exportState()), "still untouched");
      // the same steps on a plan's own state give the same state and outputs, bit for bit
      float[] yRef = ref.forward(x, g, b, w1, null, w2, null, ref.newSavedBuffer());
      check(sameBits(y, yRef), "per-call state: forward matches a plan's own state");
      expectStatus(ERROR_INVALID_ARGUMENT, "fp8State has",
          () -> p.forward(x, g, b, w1, null, w2, null, new float[T * H], saved, new float[3]),
          "an FP8 state of the wrong size");
      float[] before = st.clone();
      p.forward(new float[0], g, b, w1, null, w2, null, new float[0], null, st);
      check(sameBits(st, before), "t = 0 leaves the FP8 state as it was");

      // attached: the plan's state is the caller's buffer from now on
      ByteBuffer attached = p.newFp8StateBuffer();
      attached.asFloatBuffer().put(st);
      p.attachFp8State(attached);
      check(p.quantizerScale(QUANTIZER_LN_OUT) == st[0] && p.amaxHistory(QUANTIZER_LN_OUT)[0] == st[1],
          "quantizer state reads the attached buffer");
      p.setQuantizerState(QUANTIZER_W2, 2f, new float[HIST]);
      check(attached.asFloatBuffer().get(QUANTIZER_W2 * (1 + HIST)) == 2f, "set_quantizer_state writes it");
      p.forward(x, g, b, w1, null, w2, null, saved);
      check(attached.asFloatBuffer().get(2) == st[1], "forward moved the attached LN_OUT history down");
      expectStatus(ERROR_INVALID_ARGUMENT, null, () -> p.attachFp8State(Plan.allocateAligned(8, 16)),
          "an attached state too small");
      p.attachFp8State(null);
      check(Arrays.equals(own, p.exportState()), "detached: the plan's own state, as it was");
      System.out.println("FP8 state of the caller: per call and attached, the plan's own untouched");
    }
    try (Plan plain = Plan.builder(4, 8, 16).activations(ACT_GELU).build()) {
      expectStatus(ERROR_INVALID_ARGUMENT, "only LNMLP_RECIPE_DELAYED",
          () -> plain.attachFp8State(Plan.allocateAligned(4 * 30, 16)), "attach to a non-DELAYED plan");
      expectStatus(ERROR_INVALID_ARGUMENT, null, plain::newFp8State, "newFp8State without DELAYED");
    }
  }

  // ---- the typed variants with ABI 2's tokens and fp8_state ----------------------------------------
  private static ByteBuffer direct(float[] a) {
    ByteBuffer b = Plan.allocateAligned(4L * Math.max(a.length, 1), 64);
    b.asFloatBuffer().put(a);
    return b;
  }

  private static float[] floats(ByteBuffer b, int n) {
    float[] a = new float[n];
    b.asFloatBuffer().get(a);
    return a;
  }

  private static short[] bf16(float[] a) { // truncation is enough for inputs
    short[] s = new short[a.length];
    for (int i = 0; i < a.length; i++) s[i] = (short) (Float.floatToRawIntBits(a[i]) >>> 16);
    return s;
  }

  static void testVariants() {
    final int T = 8, H = 16, F = 32, t = 3, HIST = 2;
    Random r = new Random(11);
    float[] x = rand(r, t * H, 1, 0), g = rand(r, H, 0.5, 1), b = rand(r, H, 0.1, 0);
    float[] w1 = rand(r, H * F, 0.3, 0), w2 = rand(r, F * H, 0.3, 0);
    try (Plan p = Plan.builder(T, H, F).activations(ACT_GELU).numThreads(1).build()) {
      float[] want = p.forward(x, g, b, w1, null, w2, null, p.newSavedBuffer());
      ByteBuffer y = direct(new float[t * H]);
      LnmlpNative.plan_forward_direct(p.handle(), t, direct(x), direct(g), direct(b), direct(w1), null,
          direct(w2), null, y, p.newSavedBuffer(t), null, CALL_DEFAULT, 0);
      check(sameBits(floats(y, t * H), want), "plan_forward_direct with t tokens");
    }
    Plan.Builder delayed = Plan.builder(T, H, F).activations(ACT_GELU).recipe(RECIPE_DELAYED)
        .delayedScaling(0, HIST, AMAX_ALGO_MAX);
    try (Plan p = delayed.build()) {
      ByteBuffer st = p.newFp8StateBuffer();
      LnmlpNative.plan_forward_direct(p.handle(), t, direct(x), direct(g), direct(b), direct(w1), null,
          direct(w2), null, direct(new float[t * H]), p.newSavedBuffer(), st, CALL_DEFAULT, 0);
      check(st.asFloatBuffer().get(1) > 0, "plan_forward_direct updates a direct fp8_state");
      check(p.amaxHistory(QUANTIZER_LN_OUT)[0] == 0f, "the plan's own state untouched");
    }
    // bf16 I/O through short[], the FP8 state still float32
    DescHandle d = LnmlpNative.desc_create();
    PlanHandle ph;
    try {
      LnmlpNative.desc_set_shape(d, T, H, F);
      LnmlpNative.desc_set_activations(d, new int[] {ACT_GELU});
      LnmlpNative.desc_set_dtype(d, DTYPE_BF16);
      LnmlpNative.desc_set_recipe(d, RECIPE_DELAYED);
      LnmlpNative.desc_set_delayed_scaling(d, 0, HIST, AMAX_ALGO_MAX);
      ph = LnmlpNative.plan_create(d);
    } finally {
      LnmlpNative.desc_destroy(d);
    }
    try {
      int[] dtype = new int[1];
      long[] xs = LnmlpNative.plan_get_tensor_shape(ph, TENSOR_X, t, dtype);
      check(Arrays.equals(xs, new long[] {t, H}) && dtype[0] == DTYPE_BF16, "bf16 x shape and dtype");
      long[] ss = LnmlpNative.plan_get_tensor_shape(ph, TENSOR_FP8_STATE, TOKENS_MAX, dtype);
      check(ss[0] == QUANTIZER_COUNT && ss[1] == 1 + HIST && dtype[0] == DTYPE_F32, "FP8 state shape, f32");
      float[] st = new float[(int) (ss[0] * ss[1])];
      for (int q = 0; q < QUANTIZER_COUNT; q++) st[q * (1 + HIST)] = 1f;
      ByteBuffer saved = Plan.allocateAligned(LnmlpNative.plan_get_tensor_shape(ph, TENSOR_SAVED, t, null)[0],
          LnmlpNative.plan_get_alignment(ph));
      short[] y = new short[t * H];
      LnmlpNative.plan_forward_u16(ph, t, bf16(x), bf16(g), bf16(b), bf16(w1), null, bf16(w2), null, y,
          saved, st, CALL_DEFAULT, 0);
      check(st[1] > 0, "plan_forward_u16 writes back its float[] fp8_state");
      boolean any = false;
      for (short v : y) any |= v != 0;
      check(any, "plan_forward_u16 wrote y");
    } finally {
      LnmlpNative.plan_destroy(ph);
    }
    System.out.println("variants: _direct and _u16 with tokens and fp8_state");
  }

  // ---- LNMLP_CALL_WEIGHTS_UNCHANGED: reuse of the plan's weight copies ----------------------------
  private static boolean sameGrads(Plan.Grads a, Plan.Grads b) {
    return sameBits(a.dx, b.dx) && sameBits(a.dgamma, b.dgamma) && sameBits(a.dbeta, b.dbeta)
        && sameBits(a.dw1, b.dw1) && sameBits(a.db1, b.db1) && sameBits(a.dw2, b.dw2)
        && sameBits(a.db2, b.db2);
  }

  static void testWeightsUnchanged() {
    check(CALL_DEFAULT == 0 && CALL_WEIGHTS_UNCHANGED == 1, "CALL_* constants");
    final int T = 8, H = 32, F = 64, STEPS = 3;
    Random r = new Random(21);
    float[] g = rand(r, H, 0.5, 1), b = rand(r, H, 0.1, 0), b1 = rand(r, F, 0.1, 0), b2 = rand(r, H, 0.1, 0);
    float[] w1 = rand(r, H * F, 0.2, 0), w2 = rand(r, F * H, 0.2, 0);
    float[][] xs = new float[STEPS][], dys = new float[STEPS][];
    for (int k = 0; k < STEPS; k++) {
      xs[k] = rand(r, T * H, 2, 0);
      dys[k] = rand(r, T * H, 1, 0);
    }
    Plan.Builder current = Plan.builder(T, H, F).activations(ACT_GELU).bias(true, true)
        .recipe(RECIPE_CURRENT).numThreads(1);

    // Micro-batches with the same weights: flagged steps (after the first forward) give the bits of
    // unflagged ones, forward and backward.
    try (Plan plain = current.build(); Plan flagged = current.build()) {
      ByteBuffer s1 = plain.newSavedBuffer(), s2 = flagged.newSavedBuffer();
      for (int k = 0; k < STEPS; k++) {
        float[] y1 = new float[T * H], y2 = new float[T * H];
        plain.forward(xs[k], g, b, w1, b1, w2, b2, y1, s1, null, false);
        flagged.forward(xs[k], g, b, w1, b1, w2, b2, y2, s2, null, k > 0);
        check(sameBits(y1, y2), "CURRENT step " + k + ": flagged forward == unflagged, bit for bit");
        Plan.Grads g1 = plain.newGrads(T), g2 = flagged.newGrads(T);
        plain.backward(dys[k], xs[k], g, b, w1, b1, w2, s1, g1, null, false);
        flagged.backward(dys[k], xs[k], g, b, w1, b1, w2, s2, g2, null, true);
        check(sameGrads(g1, g2), "CURRENT step " + k + ": flagged backward == unflagged, bit for bit");
      }
      System.out.println("weights unchanged: " + STEPS + " flagged CURRENT steps give the unflagged bits");
    }

    // The flag makes the plan reuse its FP8 copies: halving w1 behind it gives the old results; a
    // call without it makes the copies afresh.
    float[] half = w1.clone();
    for (int i = 0; i < half.length; i++) half[i] *= 0.5f;
    try (Plan p = current.build(); Plan ref = current.build()) {
      ByteBuffer saved = p.newSavedBuffer();
      float[] y0 = new float[T * H];
      p.forward(xs[0], g, b, w1, b1, w2, b2, y0, saved, null, false);
      Plan.Grads g0 = p.newGrads(T);
      p.backward(dys[0], xs[0], g, b, w1, b1, w2, saved, g0, null, false);

      float[] yLie = new float[T * H];
      p.forward(xs[0], g, b, half, b1, w2, b2, yLie, saved, null, true);
      check(sameBits(yLie, y0), "w1 halved behind WEIGHTS_UNCHANGED: forward gives the old w1's results");
      Plan.Grads gLie = p.newGrads(T);
      p.backward(dys[0], xs[0], g, b, half, b1, w2, saved, gLie, null, true);
      check(sameGrads(gLie, g0), "w1 halved behind WEIGHTS_UNCHANGED: backward gives the old w1's results");

      float[] yHalf = new float[T * H], yRef = new float[T * H];
      p.forward(xs[0], g, b, half, b1, w2, b2, yHalf, saved, null, false);
      ref.forward(xs[0], g, b, half, b1, w2, b2, yRef, ref.newSavedBuffer(), null, false);
      check(!sameBits(yHalf, y0) && sameBits(yHalf, yRef), "without the flag the halved w1 is used");
      float[] yBack = new float[T * H];
      p.forward(xs[0], g, b, w1, b1, w2, b2, yBack, saved, null, true);
      check(sameBits(yBack, yHalf), "and its copies are the ones kept: the flag now reuses the halved w1's");
      System.out.println("weights unchanged: FP8 copies reused (w1 halved behind the flag changes nothing)");
    }

    // A plan without weight copies (f32, recipe NONE): the flag is harmless. JNI passes C a fresh
    // copy of each array per call and frees it after, so the library must not read the previous
    // call's addresses. x, y, w1 and w2 all have 128 elements here, so a freed copy's memory soon
    // holds another of them (this caught a library that kept an f32 plan's weight addresses).
    final int T2 = 16, H2 = 8, F2 = 16;
    float[] x2 = rand(r, T2 * H2, 2, 0), dy2 = rand(r, T2 * H2, 1, 0), g2 = rand(r, H2, 0.5, 1);
    float[] bt2 = rand(r, H2, 0.1, 0), w12 = rand(r, H2 * F2, 0.3, 0), w22 = rand(r, F2 * H2, 0.3, 0);
    try (Plan p = Plan.builder(T2, H2, F2).activations(ACT_GELU).numThreads(1).build()) {
      ByteBuffer saved = p.newSavedBuffer();
      float[] y0 = new float[T2 * H2];
      p.forward(x2, g2, bt2, w12, null, w22, null, y0, saved, null, false);
      Plan.Grads g0 = p.newGrads(T2);
      p.backward(dy2, x2, g2, bt2, w12, null, w22, saved, g0, null, false);
      for (int k = 0; k < 3; k++) {
        float[] y1 = new float[T2 * H2];
        p.forward(x2, g2, bt2, w12, null, w22, null, y1, saved, null, true);
        Plan.Grads g1 = p.newGrads(T2);
        p.backward(dy2, x2, g2, bt2, w12, null, w22, saved, g1, null, true);
        check(sameBits(y0, y1) && sameGrads(g0, g1), "f32 plan, call " + k + ": flagged calls give the unflagged bits");
      }
    }
  }

  // ---- weight-gradient accumulation ---------------------------------------------------------------
  /** max |got - ref| <= tol * max |ref| over a gradient accumulated from init. */
  private static double[] sumOf(float[] init, float[]... parts) {
    double[] s = new double[init.length];
    for (int i = 0; i < s.length; i++) s[i] = init[i];
    for (float[] p : parts) {
      for (int i = 0; i < s.length; i++) s[i] += p[i];
    }
    return s;
  }

  /** The 0.2 calls through the raw API: prepared token counts, the saved buffer's sections, the
   * deferred buffer's bytes, and backward in two calls giving plan_backward's bits. */
  static void testPreparedTokensSectionsAndTwoCalls() {
    final int T = 12, H = 32, F = 48, t = 7;
    Random r = new Random(7);
    Inputs in = new Inputs(r, t, H, F);
    float[] x = in.x, gamma = in.gamma, beta = in.beta, w1 = in.w1, b1 = in.b1, w2 = in.w2, b2 = in.b2, dy = in.dy;
    DescHandle d = LnmlpNative.desc_create();
    PlanHandle p = null;
    try {
      LnmlpNative.desc_set_shape(d, T, H, F);
      LnmlpNative.desc_set_activations(d, new int[] {ACT_GELU});
      LnmlpNative.desc_set_bias(d, 1, 1);
      LnmlpNative.desc_set_num_threads(d, 1);
      expectStatus(ERROR_INVALID_ARGUMENT, "must be >= 1",
          () -> LnmlpNative.desc_set_prepared_tokens(d, new long[] {3, 0}), "a prepared count of 0");
      LnmlpNative.desc_set_prepared_tokens(d, new long[] {3, t});
      p = LnmlpNative.plan_create(d);
      final PlanHandle plan = p;

      // Sections: FFN1 is [t, 1, F] f32 inside the saved buffer of t tokens; no FP8 scales here.
      long savedBytes = LnmlpNative.plan_get_tensor_shape(plan, TENSOR_SAVED, t, null)[0];
      long[] offset = {-7};
      int[] dtype = {-7};
      long[] ffn1 = LnmlpNative.plan_get_saved_section(plan, SAVED_FFN1, t, offset, dtype);
      check(Arrays.equals(ffn1, new long[] {t, 1, F}) && dtype[0] == DTYPE_F32,
          "FFN1 section shape " + Arrays.toString(ffn1) + " dtype " + dtype[0]);
      check(offset[0] >= 0 && offset[0] + 4L * t * F <= savedBytes,
          "FFN1 section at " + offset[0] + " inside " + savedBytes + " bytes");
      check(LnmlpNative.plan_get_saved_section(plan, SAVED_FP8_SCALES, t, offset, null) == null
          && offset[0] == -1, "no FP8 scales section without a recipe");
      check(LnmlpNative.plan_get_saved_section(plan, SAVED_RSTD, t, null, null)[0] == t, "rstd rows");
      expect(IllegalArgumentException.class,
          () -> LnmlpNative.plan_get_saved_section(plan, SAVED_FFN1, t, new long[0], null),
          "saved_section with an empty offset array");

      // Backward in two calls: bit for bit what one backward writes.
      long deferredBytes = LnmlpNative.plan_get_deferred_bytes(plan, t);
      check(deferredBytes > 0, "deferred bytes " + deferredBytes);
      long alignment = LnmlpNative.plan_get_alignment(plan);
      ByteBuffer saved = Plan.allocateAligned(savedBytes, alignment);
      float[] y = new float[t * H];
      LnmlpNative.plan_forward(plan, t, x, gamma, beta, w1, b1, w2, b2, y, saved, null, CALL_DEFAULT, 0L);
      float[][] one = {new float[t * H], new float[H], new float[H], new float[H * F], new float[F],
                       new float[F * H], new float[H]};
      LnmlpNative.plan_backward(plan, t, dy, x, gamma, beta, w1, b1, w2, saved, one[0], one[1],
          one[2], one[3], one[4], one[5], one[6], null, CALL_DEFAULT, 0L);
      float[][] two = {new float[t * H], new float[H], new float[H], new float[H * F], new float[F],
                       new float[F * H], new float[H]};
      ByteBuffer deferred = Plan.allocateAligned(deferredBytes, alignment);
      LnmlpNative.plan_backward_data(plan, t, dy, x, gamma, beta, w1, b1, w2, saved, two[0], two[1],
          two[2], two[4], two[6], deferred, null, CALL_DEFAULT, 0L);
      LnmlpNative.plan_backward_weights(plan, t, dy, saved, deferred, two[3], two[5], CALL_DEFAULT, 0L);
      String[] names = {"dx", "dgamma", "dbeta", "dW1", "db1", "dW2", "db2"};
      for (int i = 0; i < names.length; i++) {
        check(sameBits(one[i], two[i]), "two-call backward: " + names[i] + " as one backward's");
      }
      expect(IllegalArgumentException.class,
          () -> LnmlpNative.plan_backward_weights(plan, t, dy, saved, ByteBuffer.allocate(8), two[3],
              two[5], CALL_DEFAULT, 0L),
          "a heap buffer as the deferred buffer");
      System.out.println("0.2 calls: prepared tokens, saved sections, backward in two calls = one");
    } finally {
      if (p != null) LnmlpNative.plan_destroy(p);
      LnmlpNative.desc_destroy(d);
    }
  }

  static void testAccumulate() {
    final int T = 8, H = 32, F = 48;
    final int[] ts = {8, 5, 3}; // the micro-batches' tokens
    final int K = ts.length;
    Random r = new Random(31);
    float[] g = rand(r, H, 0.5, 1), b = rand(r, H, 0.1, 0), b1 = rand(r, F, 0.1, 0), b2 = rand(r, H, 0.1, 0);
    float[] w1 = rand(r, H * F, 0.3, 0), w2 = rand(r, F * H, 0.3, 0);
    float[][] xs = new float[K][], dys = new float[K][];
    for (int k = 0; k < K; k++) {
      xs[k] = rand(r, ts[k] * H, 1.5, 0.2);
      dys[k] = rand(r, ts[k] * H, 1, 0);
    }
    float[] iw1 = rand(r, H * F, 1, 0), ib1 = rand(r, F, 1, 0), iw2 = rand(r, F * H, 1, 0), ib2 = rand(r, H, 1, 0);

    // f32: the sum of the separate gradients plus the initial values
    Plan.Builder base = Plan.builder(T, H, F).activations(ACT_GELU).bias(true, true).numThreads(1);
    try (Plan sep = base.build(); Plan acc = base.accumulateGrads(true).build()) {
      check(!sep.accumulatesGrads() && acc.accumulatesGrads(), "accumulatesGrads()");
      check(acc.dtype() == DTYPE_F32 && acc.gradDtype() == DTYPE_F32, "f32 plan: f32 weight gradients");
      Plan.Grads[] parts = new Plan.Grads[K];
      ByteBuffer ss = sep.newSavedBuffer(), sa = acc.newSavedBuffer();
      float[] dw1 = iw1.clone(), db1 = ib1.clone(), dw2 = iw2.clone(), db2 = ib2.clone();
      float[] dgamma = new float[H], dbeta = new float[H];
      for (int k = 0; k < K; k++) {
        sep.forward(xs[k], g, b, w1, b1, w2, b2, ss);
        parts[k] = sep.backward(dys[k], xs[k], g, b, w1, b1, w2, ss);
        acc.forward(xs[k], g, b, w1, b1, w2, b2, new float[ts[k] * H], sa, null, k > 0);
        Arrays.fill(dgamma, Float.NaN);
        Plan.Grads out = new Plan.Grads(new float[ts[k] * H], dgamma, dbeta, dw1, db1, dw2, db2);
        acc.backward(dys[k], xs[k], g, b, w1, b1, w2, sa, out, null, k > 0);
        check(sameBits(out.dx, parts[k].dx) && sameBits(dgamma, parts[k].dgamma)
            && sameBits(dbeta, parts[k].dbeta), "micro-batch " + k + ": dx, dgamma, dbeta overwritten");
      }
      System.out.println("accumulation, f32, " + K + " micro-batches of " + Arrays.toString(ts) + " tokens:");
      final double tol = 1e-6;
      close("dW1", dw1, sumOf(iw1, parts[0].dw1, parts[1].dw1, parts[2].dw1), tol);
      close("db1", db1, sumOf(ib1, parts[0].db1, parts[1].db1, parts[2].db1), tol);
      close("dW2", dw2, sumOf(iw2, parts[0].dw2, parts[1].dw2, parts[2].dw2), tol);
      close("db2", db2, sumOf(ib2, parts[0].db2, parts[1].db2, parts[2].db2), tol);

      // 0 tokens leave the accumulated gradients as they are (dgamma and dbeta: zeros)
      float[] w1Before = dw1.clone(), b2Before = db2.clone();
      acc.backward(new float[0], new float[0], g, b, w1, b1, w2, null,
          new Plan.Grads(new float[0], dgamma, dbeta, dw1, db1, dw2, db2), null, true);
      check(sameBits(dw1, w1Before) && sameBits(db2, b2Before) && allZero(dgamma),
          "0 tokens: accumulated gradients untouched, dgamma zeros");
      expectStatus(ERROR_INVALID_ARGUMENT, "accumulates",
          () -> acc.backward(dys[0], xs[0], g, b, w1, b1, w2, sa), "allocating backward of an accumulating plan");
    }

    // bf16 I/O with fp32 weight gradients ("main grads"), accumulated: float[] dW1, db1, dW2, db2
    short[] g16 = bf16(g), b16 = bf16(b), w116 = bf16(w1), b116 = bf16(b1), w216 = bf16(w2), b216 = bf16(b2);
    Plan.Builder main = Plan.builder(T, H, F).activations(ACT_GELU).bias(true, true).numThreads(1)
        .dtype(DTYPE_BF16).gradDtype(DTYPE_F32);
    try (Plan sep = main.build(); Plan acc = main.accumulateGrads(true).build()) {
      check(acc.dtype() == DTYPE_BF16 && acc.gradDtype() == DTYPE_F32, "bf16 plan, f32 weight gradients");
      int[] dt = new int[1];
      LnmlpNative.plan_get_tensor_shape(acc.handle(), TENSOR_DB2, TOKENS_MAX, dt);
      check(dt[0] == DTYPE_F32, "the shape query's db2 dtype is F32");
      LnmlpNative.plan_get_tensor_shape(acc.handle(), TENSOR_DGAMMA, TOKENS_MAX, dt);
      check(dt[0] == DTYPE_BF16, "dgamma stays bf16");
      Plan.MainGrads[] parts = new Plan.MainGrads[K];
      ByteBuffer ss = sep.newSavedBuffer(), sa = acc.newSavedBuffer();
      Plan.MainGrads out = acc.newMainGrads(0);
      System.arraycopy(iw1, 0, out.dw1, 0, iw1.length);
      System.arraycopy(ib1, 0, out.db1, 0, ib1.length);
      System.arraycopy(iw2, 0, out.dw2, 0, iw2.length);
      System.arraycopy(ib2, 0, out.db2, 0, ib2.length);
      for (int k = 0; k < K; k++) {
        short[] x16 = bf16(xs[k]), dy16 = bf16(dys[k]);
        sep.forward(x16, g16, b16, w116, b116, w216, b216, new short[x16.length], ss, null, false);
        parts[k] = sep.newMainGrads(ts[k]);
        sep.backward(dy16, x16, g16, b16, w116, b116, w216, ss, parts[k], null, false);
        acc.forward(x16, g16, b16, w116, b116, w216, b216, new short[x16.length], sa, null, k > 0);
        acc.backward(dy16, x16, g16, b16, w116, b116, w216, sa,
            new Plan.MainGrads(new short[x16.length], out.dgamma, out.dbeta, out.dw1, out.db1, out.dw2, out.db2),
            null, k > 0);
      }
      System.out.println("accumulation, bf16 I/O into fp32 main grads:");
      final double tol = 1e-6;
      close("dW1", out.dw1, sumOf(iw1, parts[0].dw1, parts[1].dw1, parts[2].dw1), tol);
      close("db1", out.db1, sumOf(ib1, parts[0].db1, parts[1].db1, parts[2].db1), tol);
      close("dW2", out.dw2, sumOf(iw2, parts[0].dw2, parts[1].dw2, parts[2].dw2), tol);
      close("db2", out.db2, sumOf(ib2, parts[0].db2, parts[1].db2, parts[2].db2), tol);

      // a holder, array type or dtype that does not fit the plan throws before C is called
      short[] x16 = bf16(xs[0]), dy16 = bf16(dys[0]);
      Plan.Grads16 wrong = new Plan.Grads16(new short[x16.length], new short[H], new short[H],
          new short[H * F], new short[F], new short[F * H], new short[H]);
      expectStatus(ERROR_INVALID_ARGUMENT, "DTYPE_F32",
          () -> acc.backward(dy16, x16, g16, b16, w116, b116, w216, sa, wrong, null, false),
          "16-bit weight gradients for a plan whose are F32");
      expectStatus(ERROR_INVALID_ARGUMENT, "MainGrads", () -> acc.newGrads16(1), "newGrads16 of a main-grad plan");
      expectStatus(ERROR_INVALID_ARGUMENT, "DTYPE_BF16",
          () -> acc.forward(xs[0], g, b, w1, b1, w2, b2, sa), "float[] forward of a bf16 plan");
      expectStatus(ERROR_INVALID_ARGUMENT, "DTYPE_BF16", () -> acc.newGrads(1), "float[] Grads of a bf16 plan");
    }
    try (Plan p16 = Plan.builder(T, H, F).activations(ACT_GELU).dtype(DTYPE_BF16).accumulateGrads(true).build();
         Plan p32 = Plan.builder(T, H, F).activations(ACT_GELU).build()) {
      check(p16.gradDtype() == DTYPE_BF16, "default weight-gradient dtype: the plan's");
      short[] x16 = bf16(xs[0]), dy16 = bf16(dys[0]);
      Plan.MainGrads wrong = new Plan.MainGrads(new short[x16.length], new short[H], new short[H],
          new float[H * F], null, new float[F * H], null);
      expectStatus(ERROR_INVALID_ARGUMENT, "Grads16",
          () -> p16.backward(dy16, x16, g16, b16, w116, null, w216, p16.newSavedBuffer(), wrong, null, false),
          "float[] weight gradients for a plan whose are bf16");
      expectStatus(ERROR_INVALID_ARGUMENT, "Grads16", () -> p16.newMainGrads(1), "newMainGrads of a bf16-grad plan");
      // the 16-bit path itself: accumulate bf16 gradients into zeros = the gradient
      ByteBuffer saved = p16.newSavedBuffer();
      p16.forward(x16, g16, b16, w116, null, w216, null, new short[x16.length], saved, null, false);
      Plan.Grads16 gr = p16.newGrads16(ts[0]);
      p16.backward(dy16, x16, g16, b16, w116, null, w216, saved, gr, null, true);
      boolean any = false;
      for (short v : gr.dw2) any |= v != 0;
      check(any && gr.db1 == null, "bf16 weight gradients accumulated into short[]");
      expectStatus(ERROR_INVALID_ARGUMENT, "DTYPE_F32",
          () -> p32.forward(x16, g16, b16, w116, null, w216, null, new short[x16.length], null, null, false),
          "short[] forward of an f32 plan");
    }
    expectStatus(ERROR_INVALID_ARGUMENT, "weight gradients",
        () -> Plan.builder(T, H, F).dtype(DTYPE_BF16).gradDtype(DTYPE_F16).build(),
        "an F16 gradient dtype for a bf16 plan");
    System.out.println("accumulation: mismatched holders, arrays and dtypes are refused");
  }

  /**
   * Prints "native library: PATH" for each of lnmlp's, oneDNN's and the OpenMP runtime's libraries
   * this process mapped, for run_tests.sh to check that they came out of the jar.
   */
  private static void printNativeLibraries() throws java.io.IOException {
    java.util.TreeSet<String> paths = new java.util.TreeSet<>();
    for (String line : java.nio.file.Files.readAllLines(java.nio.file.Paths.get("/proc/self/maps"))) {
      String[] fields = line.trim().split("\\s+");
      String path = fields[fields.length - 1];
      if (path.matches(".*/lib(lnmlp|dnnl|gomp)[^/]*")) paths.add(path);
    }
    for (String path : paths) System.out.println("native library: " + path);
  }

  public static void main(String[] args) throws java.io.IOException {
    long t0 = System.nanoTime();
    testVersion();
    testForwardBackward();
    testErrors();
    testOutOfRangeIntegers();
    testTokens();
    testDelayedState();
    testNvfp4();
    testFp8StateOfCaller();
    testVariants();
    testWeightsUnchanged();
    testAccumulate();
    testPreparedTokensSectionsAndTwoCalls();
    printNativeLibraries();
    System.out.printf("LnmlpTest: all %d checks passed (%.2f s)%n", checks, (System.nanoTime() - t0) / 1e9);
  }
}

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
    check(ACT_GELU == 2 && NORM_RMSNORM == 1 && QUANTIZER_COUNT == 6 && FP8_FORMAT_DEFAULT == -1
        && RECIPE_MXFP8 == 4 && FEATURE_EXTERNAL_WORKSPACE == 9, "enum constants");
    expectStatus(ERROR_INVALID_ARGUMENT, null, () -> LnmlpNative.query_support(7, 0),
        "query_support with an unknown backend");

    byte[] codes = Lnmlp.fp8Encode(FP8_E4M3, new float[] {1.0f, -2.0f, 1000f, 0f}, 1.0f);
    check(codes[0] == 0x38 && codes[1] == (byte) 0xc0 && codes[2] == 0x7e && codes[3] == 0,
        "fp8 E4M3 encode: " + Arrays.toString(codes));
    float[] back = Lnmlp.fp8Decode(FP8_E4M3, codes, 2.0f);
    check(back[0] == 2f && back[1] == -4f && back[2] == 896f && back[3] == 0f,
        "fp8 E4M3 decode: " + Arrays.toString(back));
    expect(IllegalArgumentException.class,
        () -> LnmlpNative.fp8_encode(FP8_E4M3, new float[4], 1f, new byte[3]),
        "fp8_encode with a short output array");
    expectStatus(ERROR_INVALID_ARGUMENT, "scale",
        () -> LnmlpNative.fp8_encode(FP8_E4M3, new float[4], 0f, new byte[4]), "fp8 scale 0");
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
          () -> LnmlpNative.plan_forward(p, x, gamma, beta, w1, b1, w2, b2, yOut, saved, 0),
          "forward before attaching workspace");
      long ws = LnmlpNative.plan_get_workspace_bytes(p);
      LnmlpNative.plan_attach_workspace(p, Plan.allocateAligned(Math.max(ws, 1), align));
      LnmlpNative.plan_forward(p, x, gamma, beta, w1, b1, w2, b2, yOut, saved, 0);
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
          () -> LnmlpNative.plan_forward(plan.handle(), null, g, b, w1, b1, w2, b2, y, saved, 0),
          "forward with x = null");
      System.out.println("error: " + e.getMessage());
      expectStatus(ERROR_NULL_POINTER, "b1",
          () -> plan.forward(x, g, b, w1, null, w2, b2, y, saved), "forward without b1 when enabled");
      expectStatus(ERROR_INVALID_ARGUMENT, "x has 5 elements",
          () -> plan.forward(new float[5], g, b, w1, b1, w2, b2, saved), "Plan checks lengths");
      expect(IllegalArgumentException.class,
          () -> LnmlpNative.plan_forward(plan.handle(), x, g, b, w1, b1, w2, b2, y,
              ByteBuffer.allocate(4096), 0), "a heap ByteBuffer as saved");
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
      check(p1.amaxHistoryLength() == HIST, "history length " + p1.amaxHistoryLength());
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

  public static void main(String[] args) {
    long t0 = System.nanoTime();
    testVersion();
    testForwardBackward();
    testErrors();
    testDelayedState();
    System.out.printf("LnmlpTest: all %d checks passed (%.2f s)%n", checks, (System.nanoTime() - t0) / 1e9);
  }
}

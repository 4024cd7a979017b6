package org.lnmlp;

import static org.lnmlp.LnmlpNativeConstants.*;

import java.lang.ref.Cleaner;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * A validated, allocated fused {@code y = act(norm(x) @ W1 + b1) @ W2 + b2}, run forward and
 * backward many times (CPU backend, f32 tensors as {@code float[]}, row-major).
 *
 * <pre>{@code
 * try (Plan plan = Plan.builder(tokens, hidden, ffn).activations(ACT_GELU).bias(true, true).build()) {
 *   ByteBuffer saved = plan.newSavedBuffer();
 *   float[] y = plan.forward(x, gamma, beta, w1, b1, w2, b2, saved);
 *   Plan.Grads g = plan.backward(dy, x, gamma, beta, w1, b1, w2, saved);
 * }
 * }</pre>
 *
 * Shapes: x, y, dy, dx [T*H]; gamma, beta, b2 [H] (beta null for RMSNorm); w1 [H*A*F];
 * b1 [A*F]; w2 [F*H]; A = number of activations. Every length is checked before the C call
 * (an {@link LnmlpException} with ERROR_INVALID_ARGUMENT); a null where C needs a tensor gives
 * the C library's own ERROR_NULL_POINTER / ERROR_INVALID_ARGUMENT. Calls on one Plan are
 * serialised (synchronized). {@link #close()} frees the C plan; an unreachable, unclosed Plan is
 * freed by a Cleaner. Other dtypes, the CUDA backend and zero-copy buffers: use the
 * plan_forward_u16 / _direct / _ptr functions of {@link LnmlpNative} with {@link #handle()}.
 */
public final class Plan implements AutoCloseable {
  private static final Cleaner CLEANER = Cleaner.create();

  /** Destroys the C plan once, from close() or the Cleaner. */
  private static final class Destroyer implements Runnable {
    private PlanHandle handle;

    Destroyer(PlanHandle handle) {
      this.handle = handle;
    }

    @Override
    public synchronized void run() {
      if (handle != null) {
        LnmlpNative.plan_destroy(handle);
        handle = null;
      }
    }
  }

  /** Gradients written by {@link #backward}: dbeta is null for RMSNorm, db1/db2 without bias. */
  public static final class Grads {
    public final float[] dx, dgamma, dbeta, dw1, db1, dw2, db2;

    Grads(float[] dx, float[] dgamma, float[] dbeta, float[] dw1, float[] db1, float[] dw2,
        float[] db2) {
      this.dx = dx;
      this.dgamma = dgamma;
      this.dbeta = dbeta;
      this.dw1 = dw1;
      this.db1 = db1;
      this.dw2 = dw2;
      this.db2 = db2;
    }
  }

  /** The descriptor's settings; {@link #build()} creates the C descriptor and plan. */
  public static final class Builder {
    private final long tokens, hidden, ffn;
    private int norm = NORM_LAYERNORM;
    private boolean zeroCenteredGamma;
    private float epsilon = 1e-6f;
    private int[] activations = {ACT_RELU};
    private float[] clamped; // limit, alpha, offset
    private boolean bias1, bias2;
    private int remat = REMAT_SAVE_ALL;
    private int numThreads;
    private int recipe = RECIPE_NONE;
    private Integer fp8Format;
    private int[] delayed; // margin, history length, algo
    private Integer power2Scale;
    private float amaxEpsilon;
    private boolean externalWorkspace;

    Builder(long tokens, long hidden, long ffn) {
      this.tokens = tokens;
      this.hidden = hidden;
      this.ffn = ffn;
    }

    public Builder norm(int normType) { this.norm = normType; return this; }
    public Builder zeroCenteredGamma(boolean on) { this.zeroCenteredGamma = on; return this; }
    public Builder epsilon(float eps) { this.epsilon = eps; return this; }
    /** One activation, or a gated pair (e.g. ACT_SILU, ACT_LINEAR for SwiGLU). */
    public Builder activations(int... acts) { this.activations = acts.clone(); return this; }
    public Builder clampedSwiglu(float limit, float alpha, float offset) {
      this.clamped = new float[] {limit, alpha, offset};
      return this;
    }
    public Builder bias(boolean hasBias1, boolean hasBias2) {
      this.bias1 = hasBias1;
      this.bias2 = hasBias2;
      return this;
    }
    public Builder remat(int policy) { this.remat = policy; return this; }
    public Builder numThreads(int n) { this.numThreads = n; return this; }
    public Builder recipe(int recipe) { this.recipe = recipe; return this; }
    public Builder fp8Format(int format) { this.fp8Format = format; return this; }
    public Builder delayedScaling(int margin, int amaxHistoryLen, int amaxComputeAlgo) {
      this.delayed = new int[] {margin, amaxHistoryLen, amaxComputeAlgo};
      return this;
    }
    public Builder scalingOptions(int power2Scale, float amaxEpsilon) {
      this.power2Scale = power2Scale;
      this.amaxEpsilon = amaxEpsilon;
      return this;
    }
    /** The plan allocates no workspace; attach one with {@link Plan#attachWorkspace}. */
    public Builder externalWorkspace(boolean on) { this.externalWorkspace = on; return this; }

    public Plan build() {
      DescHandle d = LnmlpNative.desc_create();
      try {
        LnmlpNative.desc_set_shape(d, tokens, hidden, ffn);
        LnmlpNative.desc_set_norm(d, norm);
        LnmlpNative.desc_set_zero_centered_gamma(d, zeroCenteredGamma ? 1 : 0);
        LnmlpNative.desc_set_epsilon(d, epsilon);
        LnmlpNative.desc_set_activations(d, activations);
        if (clamped != null) LnmlpNative.desc_set_clamped_swiglu(d, clamped[0], clamped[1], clamped[2]);
        LnmlpNative.desc_set_bias(d, bias1 ? 1 : 0, bias2 ? 1 : 0);
        LnmlpNative.desc_set_dtype(d, DTYPE_F32);
        LnmlpNative.desc_set_remat(d, remat);
        LnmlpNative.desc_set_num_threads(d, numThreads);
        LnmlpNative.desc_set_recipe(d, recipe);
        if (fp8Format != null) LnmlpNative.desc_set_fp8_format(d, fp8Format);
        if (delayed != null) LnmlpNative.desc_set_delayed_scaling(d, delayed[0], delayed[1], delayed[2]);
        if (power2Scale != null) LnmlpNative.desc_set_scaling_options(d, power2Scale, amaxEpsilon);
        LnmlpNative.desc_set_external_workspace(d, externalWorkspace ? 1 : 0);
        return new Plan(LnmlpNative.plan_create(d), this);
      } finally {
        LnmlpNative.desc_destroy(d);
      }
    }
  }

  public static Builder builder(long tokens, long hidden, long ffn) {
    return new Builder(tokens, hidden, ffn);
  }

  private PlanHandle handle;
  private final Destroyer destroyer;
  private final Cleaner.Cleanable cleanable;
  private final long tokens, hidden, ffn;
  private final int numActivations;
  private final boolean bias1, bias2, rmsnorm;
  private final long workspaceBytes, savedBytes, savedBytesPerToken, alignment, stateBytes;
  private final int amaxHistoryLength;
  private ByteBuffer workspace; // kept reachable while attached

  private Plan(PlanHandle h, Builder b) {
    this.handle = h;
    this.destroyer = new Destroyer(h);
    this.cleanable = CLEANER.register(this, destroyer);
    this.tokens = b.tokens;
    this.hidden = b.hidden;
    this.ffn = b.ffn;
    this.numActivations = b.activations.length;
    this.bias1 = b.bias1;
    this.bias2 = b.bias2;
    this.rmsnorm = b.norm == NORM_RMSNORM;
    this.workspaceBytes = LnmlpNative.plan_get_workspace_bytes(h);
    this.savedBytes = LnmlpNative.plan_get_saved_bytes(h);
    this.savedBytesPerToken = LnmlpNative.plan_get_saved_bytes_per_token(h);
    this.alignment = LnmlpNative.plan_get_alignment(h);
    this.stateBytes = LnmlpNative.plan_get_state_bytes(h);
    this.amaxHistoryLength = LnmlpNative.plan_get_amax_history_length(h);
  }

  // ---- lifetime ------------------------------------------------------------------------------

  /** Frees the C plan. Idempotent; later calls throw ERROR_INVALID_HANDLE. */
  @Override
  public synchronized void close() {
    handle = null;
    workspace = null;
    cleanable.clean();
  }

  public synchronized boolean isClosed() {
    return handle == null;
  }

  /** The C handle, for the LnmlpNative functions; valid until close(). */
  public synchronized PlanHandle handle() {
    return live();
  }

  private PlanHandle live() {
    if (handle == null) {
      throw new LnmlpException(ERROR_INVALID_HANDLE, "this Plan is closed; build a new one");
    }
    return handle;
  }

  // ---- sizes ---------------------------------------------------------------------------------

  public long tokens() { return tokens; }
  public long hidden() { return hidden; }
  public long ffn() { return ffn; }
  public int numActivations() { return numActivations; }
  public long workspaceBytes() { return workspaceBytes; }
  public long savedBytes() { return savedBytes; }
  public long savedBytesPerToken() { return savedBytesPerToken; }
  public long alignment() { return alignment; }
  public long stateBytes() { return stateBytes; }
  public int amaxHistoryLength() { return amaxHistoryLength; }

  /** A zeroed direct buffer of {@code bytes} bytes whose address is a multiple of alignment. */
  public static ByteBuffer allocateAligned(long bytes, long alignment) {
    if (bytes < 0 || alignment < 1 || bytes + alignment > Integer.MAX_VALUE) {
      throw new LnmlpException(ERROR_SIZE_OVERFLOW,
          bytes + " bytes aligned to " + alignment + " do not fit a java.nio.ByteBuffer");
    }
    ByteBuffer raw = ByteBuffer.allocateDirect((int) (bytes + alignment));
    ByteBuffer b = raw.alignedSlice((int) alignment);
    b.limit((int) bytes);
    return b.slice().order(ByteOrder.nativeOrder());
  }

  /** A buffer for forward's saved state (savedBytes, aligned); null when the plan saves nothing. */
  public ByteBuffer newSavedBuffer() {
    return savedBytes == 0 ? null : allocateAligned(savedBytes, alignment);
  }

  /** Attaches caller-owned workspace (externalWorkspace plans); kept reachable by this Plan. */
  public synchronized void attachWorkspace(ByteBuffer ws) {
    LnmlpNative.plan_attach_workspace(live(), ws);
    workspace = ws;
  }

  // ---- forward / backward ----------------------------------------------------------------------

  private static void len(String name, float[] a, long expect, String what) {
    if (a != null && a.length != expect) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT,
          name + " has " + a.length + " elements, but this plan needs " + what + " = " + expect);
    }
  }

  private void checkSaved(ByteBuffer saved) {
    if (saved == null) return; // C says whether it may be null
    if (!saved.isDirect()) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT,
          "saved must be a direct ByteBuffer (use Plan.newSavedBuffer())");
    }
    if (saved.capacity() < savedBytes) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT, "saved has " + saved.capacity()
          + " bytes, but this plan needs " + savedBytes + " (use Plan.newSavedBuffer())");
    }
  }

  private void checkInputs(float[] x, float[] gamma, float[] beta, float[] w1, float[] b1,
      float[] w2, float[] b2) {
    len("x", x, tokens * hidden, "tokens*hidden");
    len("gamma", gamma, hidden, "hidden");
    len("beta", beta, hidden, "hidden");
    len("w1", w1, hidden * numActivations * ffn, "hidden*activations*ffn");
    len("b1", b1, numActivations * ffn, "activations*ffn");
    len("w2", w2, ffn * hidden, "ffn*hidden");
    len("b2", b2, hidden, "hidden");
  }

  /** Forward into y; writes saved (from {@link #newSavedBuffer()}) for backward. */
  public synchronized void forward(float[] x, float[] gamma, float[] beta, float[] w1, float[] b1,
      float[] w2, float[] b2, float[] y, ByteBuffer saved) {
    PlanHandle h = live();
    checkInputs(x, gamma, beta, w1, b1, w2, b2);
    len("y", y, tokens * hidden, "tokens*hidden");
    checkSaved(saved);
    LnmlpNative.plan_forward(h, x, gamma, beta, w1, b1, w2, b2, y, saved, 0L);
  }

  /** Forward; returns a new y [T*H]. */
  public float[] forward(float[] x, float[] gamma, float[] beta, float[] w1, float[] b1,
      float[] w2, float[] b2, ByteBuffer saved) {
    float[] y = new float[Math.toIntExact(tokens * hidden)];
    forward(x, gamma, beta, w1, b1, w2, b2, y, saved);
    return y;
  }

  /** Backward into caller arrays (null for the absent dbeta / db1 / db2). */
  public synchronized void backward(float[] dy, float[] x, float[] gamma, float[] beta, float[] w1,
      float[] b1, float[] w2, ByteBuffer saved, Grads out) {
    PlanHandle h = live();
    len("dy", dy, tokens * hidden, "tokens*hidden");
    checkInputs(x, gamma, beta, w1, b1, w2, null);
    checkSaved(saved);
    len("dx", out.dx, tokens * hidden, "tokens*hidden");
    len("dgamma", out.dgamma, hidden, "hidden");
    len("dbeta", out.dbeta, hidden, "hidden");
    len("dw1", out.dw1, hidden * numActivations * ffn, "hidden*activations*ffn");
    len("db1", out.db1, numActivations * ffn, "activations*ffn");
    len("dw2", out.dw2, ffn * hidden, "ffn*hidden");
    len("db2", out.db2, hidden, "hidden");
    LnmlpNative.plan_backward(h, dy, x, gamma, beta, w1, b1, w2, saved, out.dx, out.dgamma,
        out.dbeta, out.dw1, out.db1, out.dw2, out.db2, 0L);
  }

  /** Backward; returns new gradient arrays. */
  public Grads backward(float[] dy, float[] x, float[] gamma, float[] beta, float[] w1, float[] b1,
      float[] w2, ByteBuffer saved) {
    int th = Math.toIntExact(tokens * hidden), hh = Math.toIntExact(hidden);
    int af = Math.toIntExact(numActivations * ffn);
    Grads g = new Grads(new float[th], new float[hh], rmsnorm ? null : new float[hh],
        new float[Math.toIntExact(hidden * numActivations * ffn)], bias1 ? new float[af] : null,
        new float[Math.toIntExact(ffn * hidden)], bias2 ? new float[hh] : null);
    backward(dy, x, gamma, beta, w1, b1, w2, saved, g);
    return g;
  }

  // ---- FP8 quantizer state (DELAYED recipe) ----------------------------------------------------

  /** The scale of quantizer q (QUANTIZER_*). */
  public synchronized float quantizerScale(int q) {
    return LnmlpNative.plan_get_quantizer_state(live(), q, null);
  }

  /** The amax history of quantizer q, newest first (a copy). */
  public synchronized float[] amaxHistory(int q) {
    float[] h = new float[amaxHistoryLength];
    LnmlpNative.plan_get_quantizer_state(live(), q, h);
    return h;
  }

  /** Replaces quantizer q's scale and history (amaxHistoryLength() entries, newest first). */
  public synchronized void setQuantizerState(int q, float scale, float[] amaxHistory) {
    LnmlpNative.plan_set_quantizer_state(live(), q, scale, amaxHistory);
  }

  /** The whole quantizer state as a versioned blob; empty for stateless recipes. */
  public synchronized byte[] exportState() {
    PlanHandle h = live();
    byte[] blob = new byte[Math.toIntExact(stateBytes)];
    if (blob.length > 0) LnmlpNative.plan_export_state(h, blob);
    return blob;
  }

  /** Restores a blob from {@link #exportState()} of a plan with the same recipe and history. */
  public synchronized void importState(byte[] blob) {
    LnmlpNative.plan_import_state(live(), blob);
  }
}

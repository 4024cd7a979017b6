package org.lnmlp;

import static org.lnmlp.LnmlpNativeConstants.*;

import java.lang.ref.Cleaner;
import java.lang.reflect.Array;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * A validated, allocated fused {@code y = act(norm(x) @ W1 + b1) @ W2 + b2}, run forward and
 * backward many times (CPU backend, row-major tensors: {@code float[]} for an f32 plan,
 * {@code short[]} bit patterns for a bf16 / f16 plan ({@link Builder#dtype})).
 *
 * <pre>{@code
 * try (Plan plan = Plan.builder(tokens, hidden, ffn).activations(ACT_GELU).bias(true, true).build()) {
 *   ByteBuffer saved = plan.newSavedBuffer();
 *   float[] y = plan.forward(x, gamma, beta, w1, b1, w2, b2, saved);
 *   Plan.Grads g = plan.backward(dy, x, gamma, beta, w1, b1, w2, saved);
 * }
 * }</pre>
 *
 * Shapes: x, y, dy, dx [t*H]; gamma, beta, b2 [H] (beta null for RMSNorm); w1 [H*A*F];
 * b1 [A*F]; w2 [F*H]; A = number of activations. The builder's tokens T is the most tokens one
 * call takes ({@link #maxTokens()}): each call's t is x.length / H, from 0 to T. Every length
 * comes from the library's shape query ({@link #tensorShape}) and is checked before the C call
 * (an {@link LnmlpException} with ERROR_INVALID_ARGUMENT); a null where C needs a tensor, or a t
 * above T, gives the C library's own error and message. Calls on one Plan are
 * serialised (synchronized). {@link #close()} frees the C plan; an unreachable, unclosed Plan is
 * freed by a Cleaner. The CUDA backend (experimental) and zero-copy buffers: use the
 * plan_forward_direct / _ptr functions of {@link LnmlpNative} with {@link #handle()}.
 *
 * <p>Element types: every tensor is in the plan's dtype ({@link #dtype()}), except the weight
 * gradients dW1, db1, dW2, db2, which are in {@link #gradDtype()}: the dtype or, with
 * {@link Builder#gradDtype}(DTYPE_F32), fp32 "main grads" of a bf16 / f16 plan; and the weights
 * W1, W2, which are in {@link #weightDtype()}: the dtype or, with
 * {@link Builder#weightDtype}(DTYPE_F32) and an FP8 recipe, fp32 master weights of a bf16 / f16
 * plan (this class's short[] calls refuse such a plan: pass direct ByteBuffers to
 * LnmlpNative.plan_forward_direct / plan_backward_direct with {@link #handle()}). Gradients go into
 * {@link Grads} (f32 plans), {@link Grads16} (bf16 / f16 plans, 16-bit weight gradients) or
 * {@link MainGrads} (bf16 / f16 plans, fp32 weight gradients); a holder, array type or dtype
 * that does not fit the plan throws {@link LnmlpException} (ERROR_INVALID_ARGUMENT) before C is
 * called.
 *
 * <p>Gradient accumulation ({@link Builder#accumulateGrads}): backward adds this call's dW1, db1,
 * dW2 and db2 into the caller's arrays (dgamma, dbeta and dx are overwritten), e.g. over the
 * micro-batches of a step; the allocating {@link #backward(float[], float[], float[], float[],
 * float[], float[], float[], ByteBuffer)} is then refused: pass your arrays.
 *
 * <p>{@code weightsUnchanged} (the overloads that take it; LNMLP_CALL_WEIGHTS_UNCHANGED): w1 and w2
 * hold the values they had when the plan last made its copies of them (f16 widened copies, FP8
 * quantized ones), so the call reuses those copies (TransformerEngine's
 * is_first_microbatch=False). If w1 / w2 did change, the call computes with the old copies.
 *
 * <p>FP8 delayed scaling: the plan keeps its own state, or a caller's: per call (the
 * {@code fp8State} overloads, a float[] of {@link #newFp8State()}'s layout, updated in place) or
 * attached ({@link #attachFp8State}, a direct buffer from {@link #newFp8StateBuffer()}).
 *
 * <p>A forward or backward that throws has changed nothing, except one that failed while it ran
 * (status {@code LnmlpNative.ERROR_OUT_OF_MEMORY}, {@code ERROR_BACKEND} or {@code ERROR_INTERNAL}):
 * the arrays it writes are then undefined -- accumulated gradients may hold part of the call's
 * sum, so keep a copy or drop the step -- while the FP8 state is as it was and the plan stays
 * usable.
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

  /** A backward call's gradients: dx, dgamma, dbeta are arrays of type {@code A} (the plan's
   * dtype: float[] or short[] 16-bit patterns), dw1, db1, dw2, db2 of type {@code G} (the weight
   * gradients' dtype); null for the gradients the plan does not have (dbeta for RMSNorm, db1 and
   * db2 without bias). The three holders below fix the types. */
  public static class Gradients<A, G> {
    public final A dx, dgamma, dbeta;
    public final G dw1, db1, dw2, db2;

    Gradients(A dx, A dgamma, A dbeta, G dw1, G db1, G dw2, G db2) {
      this.dx = dx;
      this.dgamma = dgamma;
      this.dbeta = dbeta;
      this.dw1 = dw1;
      this.db1 = db1;
      this.dw2 = dw2;
      this.db2 = db2;
    }
  }

  /** Gradients of an f32 plan, written by {@link #backward}; see {@link #newGrads}. */
  public static final class Grads extends Gradients<float[], float[]> {
    /** Caller arrays (null for the gradients the plan does not have). */
    public Grads(float[] dx, float[] dgamma, float[] dbeta, float[] dw1, float[] db1, float[] dw2,
        float[] db2) {
      super(dx, dgamma, dbeta, dw1, db1, dw2, db2);
    }
  }

  /** Gradients of a bf16 / f16 plan whose weight gradients are in its dtype: every array holds
   * 16-bit patterns; see {@link #newGrads16}. */
  public static final class Grads16 extends Gradients<short[], short[]> {
    public Grads16(short[] dx, short[] dgamma, short[] dbeta, short[] dw1, short[] db1, short[] dw2,
        short[] db2) {
      super(dx, dgamma, dbeta, dw1, db1, dw2, db2);
    }
  }

  /** Gradients of a bf16 / f16 plan whose weight gradients are fp32 ({@code gradDtype(DTYPE_F32)},
   * "main grads"): dx, dgamma, dbeta in the plan's dtype (16-bit patterns), dw1, db1, dw2, db2
   * float[]; see {@link #newMainGrads}. */
  public static final class MainGrads extends Gradients<short[], float[]> {
    public MainGrads(short[] dx, short[] dgamma, short[] dbeta, float[] dw1, float[] db1,
        float[] dw2, float[] db2) {
      super(dx, dgamma, dbeta, dw1, db1, dw2, db2);
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
    private int dtype = DTYPE_F32;
    private boolean accumulateGrads;
    private int gradDtype = -1;
    private int weightDtype = -1;
    private int weightLayout = WEIGHT_LAYOUT_IN_OUT;
    private int remat = REMAT_SAVE_ALL;
    private long numThreads;
    private int recipe = RECIPE_NONE;
    private Integer fp8Format;
    private boolean delayed;
    private int delayedMargin, delayedAlgo;
    private long delayedHistoryLen;
    private Integer power2Scale;
    private float amaxEpsilon;
    private int[] nvfp4Disable;
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
    /** The I/O dtype: DTYPE_F32 (default; float[] tensors), DTYPE_BF16 or DTYPE_F16 (short[]). */
    public Builder dtype(int dtype) { this.dtype = dtype; return this; }
    /** backward adds into dW1, db1, dW2, db2 instead of overwriting them (lnmlp_desc_set_weight_gradients). */
    public Builder accumulateGrads(boolean on) { this.accumulateGrads = on; return this; }
    /** The dtype of dW1, db1, dW2, db2: -1 (default) the plan's dtype, or DTYPE_F32 (fp32 "main
     * grads" of a bf16 / f16 plan); build() refuses any other. */
    public Builder gradDtype(int dtype) { this.gradDtype = dtype; return this; }
    /** The dtype of W1 and W2 (lnmlp_desc_set_weight_dtype): -1 (default) the plan's dtype, or
     * DTYPE_F32 (fp32 master weights of a bf16 / f16 plan, which only an FP8 recipe accepts:
     * build() throws ERROR_NOT_SUPPORTED without one); build() refuses any other. */
    public Builder weightDtype(int dtype) { this.weightDtype = dtype; return this; }
    /** The layout of W1 and W2 and their gradients (lnmlp_desc_set_weight_layout):
     * WEIGHT_LAYOUT_IN_OUT (default: W1 [H, A, F], W2 [F, H]) or WEIGHT_LAYOUT_OUT_IN (W1 [A, F, H],
     * W2 [H, F], PyTorch's); both compute the same block. */
    public Builder weightLayout(int layout) { this.weightLayout = layout; return this; }
    public Builder remat(int policy) { this.remat = policy; return this; }
    /** CPU threads; 0 (default) uses every core the process may run on. */
    public Builder numThreads(long n) { this.numThreads = n; return this; }
    public Builder recipe(int recipe) { this.recipe = recipe; return this; }
    public Builder fp8Format(int format) { this.fp8Format = format; return this; }
    public Builder delayedScaling(int margin, long amaxHistoryLen, int amaxComputeAlgo) {
      this.delayed = true;
      this.delayedMargin = margin;
      this.delayedHistoryLen = amaxHistoryLen;
      this.delayedAlgo = amaxComputeAlgo;
      return this;
    }
    public Builder scalingOptions(int power2Scale, float amaxEpsilon) {
      this.power2Scale = power2Scale;
      this.amaxEpsilon = amaxEpsilon;
      return this;
    }
    /**
     * NVFP4's options (RECIPE_NVFP4; TransformerEngine's NVFP4BlockScaling fields, false each by
     * default): no Hadamard transform, no stochastic rounding, no 16x16 weight tiles.
     */
    public Builder nvfp4Options(boolean disableRht, boolean disableStochasticRounding, boolean disable2dQuantization) {
      this.nvfp4Disable =
          new int[] {disableRht ? 1 : 0, disableStochasticRounding ? 1 : 0, disable2dQuantization ? 1 : 0};
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
        LnmlpNative.desc_set_dtype(d, dtype);
        LnmlpNative.desc_set_weight_gradients(d, accumulateGrads ? 1 : 0, gradDtype);
        LnmlpNative.desc_set_weight_dtype(d, weightDtype);
        LnmlpNative.desc_set_weight_layout(d, weightLayout);
        LnmlpNative.desc_set_remat(d, remat);
        LnmlpNative.desc_set_num_threads(d, numThreads);
        LnmlpNative.desc_set_recipe(d, recipe);
        if (fp8Format != null) LnmlpNative.desc_set_fp8_format(d, fp8Format);
        if (delayed) LnmlpNative.desc_set_delayed_scaling(d, delayedMargin, delayedHistoryLen, delayedAlgo);
        if (power2Scale != null) LnmlpNative.desc_set_scaling_options(d, power2Scale, amaxEpsilon);
        if (nvfp4Disable != null)
          LnmlpNative.desc_set_nvfp4_options(d, nvfp4Disable[0], nvfp4Disable[1], nvfp4Disable[2]);
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
  private final long tokens, hidden, ffn, maxTokens;
  private final int numActivations;
  private final int dtype, gradDtype, weightDtype, weightLayout;
  private final boolean accumulateGrads;
  private final long workspaceBytes, savedBytes, savedBytesPerToken, alignment, stateBytes;
  private final long amaxHistoryLength;
  private ByteBuffer workspace; // kept reachable while attached
  private ByteBuffer fp8State; // kept reachable while attached

  private Plan(PlanHandle h, Builder b) {
    this.handle = h;
    this.destroyer = new Destroyer(h);
    this.cleanable = CLEANER.register(this, destroyer);
    this.tokens = b.tokens;
    this.hidden = b.hidden;
    this.ffn = b.ffn;
    this.numActivations = b.activations.length;
    int[] dt = new int[1];
    this.maxTokens = LnmlpNative.plan_get_tensor_shape(h, TENSOR_X, TOKENS_MAX, dt)[0];
    this.dtype = dt[0];
    LnmlpNative.plan_get_tensor_shape(h, TENSOR_DW1, TOKENS_MAX, dt); // dW1 is always taken
    this.gradDtype = dt[0];
    LnmlpNative.plan_get_tensor_shape(h, TENSOR_W1, TOKENS_MAX, dt); // W1 too
    this.weightDtype = dt[0];
    this.weightLayout = b.weightLayout;
    this.accumulateGrads = b.accumulateGrads;
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
    fp8State = null;
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

  /** The builder's tokens: the most one call takes (see {@link #maxTokens()}). */
  public long tokens() { return tokens; }
  /** The most tokens of one call (the shape query's, LNMLP_TOKENS_MAX). */
  public long maxTokens() { return maxTokens; }
  public long hidden() { return hidden; }
  public long ffn() { return ffn; }
  public int numActivations() { return numActivations; }
  /** The I/O dtype (DTYPE_*): of every tensor but the weight gradients (and W1, W2 with
   * {@link Builder#weightDtype}). */
  public int dtype() { return dtype; }
  /** The dtype of dW1, db1, dW2 and db2 (the shape query's): dtype(), or DTYPE_F32. */
  public int gradDtype() { return gradDtype; }
  /** The dtype of W1 and W2 (the shape query's): dtype(), or DTYPE_F32. */
  public int weightDtype() { return weightDtype; }
  /** The layout of W1, W2, dW1 and dW2 (WEIGHT_LAYOUT_*, {@link Builder#weightLayout}). */
  public int weightLayout() { return weightLayout; }
  /** Whether backward adds into dW1, db1, dW2, db2 ({@link Builder#accumulateGrads}). */
  public boolean accumulatesGrads() { return accumulateGrads; }
  public long workspaceBytes() { return workspaceBytes; }
  public long savedBytes() { return savedBytes; }
  public long savedBytesPerToken() { return savedBytesPerToken; }
  public long alignment() { return alignment; }
  /** The size of {@link #exportState()}'s blob (0 for a stateless recipe). Experimental: the
   * state blob's format may change in any release. */
  public long stateBytes() { return stateBytes; }
  /** The amax history length of a DELAYED plan; 0 for any other recipe. */
  public long amaxHistoryLength() { return amaxHistoryLength; }

  /** A zeroed direct buffer of {@code bytes} bytes whose address is a multiple of alignment. */
  public static ByteBuffer allocateAligned(long bytes, long alignment) {
    // Compared before any sum is formed (bytes + alignment could wrap past Long.MAX_VALUE).
    if (bytes < 0 || alignment < 1 || alignment > Integer.MAX_VALUE / 2
        || bytes > Integer.MAX_VALUE - 2 * alignment) {
      throw new LnmlpException(ERROR_SIZE_OVERFLOW,
          bytes + " bytes aligned to " + alignment + " do not fit a java.nio.ByteBuffer");
    }
    // alignedSlice rounds both ends inwards: bytes rounded up to the alignment, plus one more
    // alignment, always leaves bytes between them (bytes + alignment did not when bytes was not
    // a multiple of it and the buffer's address was unaligned).
    long padded = (bytes + alignment - 1) / alignment * alignment + alignment;
    ByteBuffer raw = ByteBuffer.allocateDirect((int) padded);
    ByteBuffer b = raw.alignedSlice((int) alignment);
    b.limit((int) bytes);
    return b.slice().order(ByteOrder.nativeOrder());
  }

  /**
   * The dimensions (C order, row-major) of a tensor (TENSOR_*) in a call with {@code tokens}
   * tokens (0 .. maxTokens(), or TOKENS_MAX), from lnmlp_plan_get_tensor_shape; null when the
   * plan does not take it (pass null for it).
   */
  public synchronized long[] tensorShape(int tensor, long tokens) {
    return LnmlpNative.plan_get_tensor_shape(live(), tensor, tokens, null);
  }

  /** {@link #tensorShape(int, long)} for the plan's most tokens. */
  public long[] tensorShape(int tensor) {
    return tensorShape(tensor, TOKENS_MAX);
  }

  /** {@code n} elements as a Java array length; ERROR_SIZE_OVERFLOW (not a wrapped int, nor
   * Math.toIntExact's ArithmeticException) when more than an array holds. */
  private static int arrayLength(String what, long n) {
    if (n < 0 || n > Integer.MAX_VALUE) {
      throw new LnmlpException(ERROR_SIZE_OVERFLOW,
          what + " has " + n + " elements, more than a Java array holds (Integer.MAX_VALUE)");
    }
    return (int) n;
  }

  /** The number of elements of a tensor of that shape; -1 when the plan does not take it. */
  private long elements(int tensor, long tokens) {
    long[] dims = LnmlpNative.plan_get_tensor_shape(handle, tensor, tokens, null);
    if (dims == null) return -1;
    long n = 1;
    for (long d : dims) n *= d;
    return n;
  }

  private long elements(int tensor) {
    return elements(tensor, TOKENS_MAX);
  }

  /** The shape query's tokens for a call of t: t itself in range, else the plan's most (the C
   * call then refuses t with its own message). */
  private long queryTokens(long t) {
    return t >= 0 && t <= maxTokens ? t : TOKENS_MAX;
  }

  /** A buffer for forward's saved state for the plan's most tokens (serves every call); null when
   * the plan saves nothing. */
  public ByteBuffer newSavedBuffer() {
    return savedBytes == 0 ? null : allocateAligned(savedBytes, alignment);
  }

  /** A buffer for the saved state of a call with {@code tokens} tokens (fewer bytes than
   * {@link #newSavedBuffer()} when tokens &lt; maxTokens()); null when the plan saves nothing. */
  public synchronized ByteBuffer newSavedBuffer(long tokens) {
    live();
    long bytes = elements(TENSOR_SAVED, tokens);
    return bytes < 0 ? null : allocateAligned(bytes, alignment);
  }

  /** Attaches caller-owned workspace (externalWorkspace plans); kept reachable by this Plan. */
  public synchronized void attachWorkspace(ByteBuffer ws) {
    LnmlpNative.plan_attach_workspace(live(), ws);
    workspace = ws;
  }

  // ---- forward / backward ----------------------------------------------------------------------

  private static String dtypeName(int dt) {
    switch (dt) {
      case DTYPE_F32: return "DTYPE_F32";
      case DTYPE_BF16: return "DTYPE_BF16";
      case DTYPE_F16: return "DTYPE_F16";
      default: return "dtype " + dt;
    }
  }

  /** The call's flags. JNI hands C a fresh copy of each Java array per call, so the library must
   * (and does) keep copies of the weights, never their addresses, from one call to the next. */
  private static int flags(boolean weightsUnchanged) {
    return weightsUnchanged ? CALL_WEIGHTS_UNCHANGED : CALL_DEFAULT;
  }

  /** float[] tensors are for f32 plans only. */
  private void requireF32(String what) {
    if (dtype != DTYPE_F32) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT, what + " takes float[] tensors, for an f32 plan; this plan's"
          + " dtype is " + dtypeName(dtype) + ": pass short[] bit patterns (the short[] overloads)");
    }
  }

  /** short[] tensors are for bf16 / f16 plans only. */
  private void require16(String what) {
    if (dtype != DTYPE_BF16 && dtype != DTYPE_F16) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT, what + " takes short[] tensors, for a bf16 / f16 plan; this"
          + " plan's dtype is " + dtypeName(dtype) + ": pass float[] (the float[] overloads)");
    }
  }

  /** short[] w1 / w2 hold 16-bit weights: the plan's W1 and W2 must be in its dtype. */
  private void requireWeightDtype16(String what) {
    if (weightDtype != dtype) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT, what + " takes short[] w1 and w2, but this plan's W1, W2 are "
          + dtypeName(weightDtype) + " (weightDtype; plan dtype " + dtypeName(dtype) + "): pass direct ByteBuffers"
          + " to LnmlpNative.plan_forward_direct / plan_backward_direct with handle()");
    }
  }

  /** The gradient holder must fit the plan's weight-gradient dtype. */
  private void requireGradDtype(int want, String holder) {
    if (gradDtype != want) {
      String fit = gradDtype == DTYPE_F32 ? (dtype == DTYPE_F32 ? "Plan.Grads (newGrads)" : "Plan.MainGrads (newMainGrads)")
          : "Plan.Grads16 (newGrads16)";
      throw new LnmlpException(ERROR_INVALID_ARGUMENT, holder + " holds " + dtypeName(want)
          + " weight gradients, but this plan's dW1, db1, dW2, db2 are " + dtypeName(gradDtype)
          + " (plan dtype " + dtypeName(dtype) + "): use " + fit);
    }
  }

  /** The allocating backward would accumulate into fresh arrays and lose them. */
  private void requireNotAccumulating() {
    if (accumulateGrads) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT, "this plan accumulates its weight gradients"
          + " (accumulateGrads(true)): pass the gradient arrays to add into, backward(..., Grads out, ...)");
    }
  }

  /** Checks a tensor's length against the shape query. A null where C needs the tensor, or a
   * tensor the plan does not take (expect -1: it must be null), is left to C (its own error). */
  private static void len(String name, int length, boolean isNull, long expect) {
    if (isNull || expect < 0) return;
    if (length != expect) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT,
          name + " has " + length + " elements, but this plan needs " + expect);
    }
  }

  /** {@link #len(String, int, boolean, long)} of a float[] or short[]. */
  private static void len(String name, Object array, long expect) {
    len(name, n(array), array == null, expect);
  }

  /** The call's tokens: x.length / H (x is [t, H]). A t above maxTokens() is passed on to C,
   * which refuses it with its own message. A null x gives 0 (C says whether x may be null). */
  private long tokensOf(String name, int length) {
    long h = hidden;
    if (length % h != 0) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT, name + " has " + length
          + " elements, but this plan needs tokens*hidden with hidden = " + h + " and 0 to "
          + maxTokens + " tokens");
    }
    return length / h;
  }

  private void checkSaved(ByteBuffer saved, long t) {
    if (saved == null) return; // C says whether it may be null
    if (!saved.isDirect()) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT,
          "saved must be a direct ByteBuffer (use Plan.newSavedBuffer())");
    }
    long need = elements(TENSOR_SAVED, queryTokens(t));
    if (saved.capacity() < need) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT, "saved has " + saved.capacity()
          + " bytes, but a call with " + t + " tokens needs " + need + " (use Plan.newSavedBuffer())");
    }
  }

  /** The parameters' lengths (float[] or short[] arrays) against the shape query. */
  private void checkInputs(Object gamma, Object beta, Object w1, Object b1, Object w2, Object b2,
      float[] fp8State) {
    len("gamma", gamma, elements(TENSOR_GAMMA));
    len("beta", beta, elements(TENSOR_BETA));
    len("w1", w1, elements(TENSOR_W1));
    len("b1", b1, elements(TENSOR_B1));
    len("w2", w2, elements(TENSOR_W2));
    len("b2", b2, elements(TENSOR_B2));
    len("fp8State", fp8State, elements(TENSOR_FP8_STATE));
  }

  /** A forward's checks, either array type; returns its tokens (x.length / H). */
  private long checkForward(Object x, Object gamma, Object beta, Object w1, Object b1, Object w2,
      Object b2, Object y, ByteBuffer saved, float[] fp8State) {
    long t = x == null ? 0 : tokensOf("x", n(x));
    checkInputs(gamma, beta, w1, b1, w2, b2, fp8State);
    if (x != null) len("y", y, n(x));
    checkSaved(saved, t);
    return t;
  }

  /** A backward's checks, either array type, once the holder's types are known to fit; returns
   * its tokens (x.length / H). */
  private long checkBackward(Object dy, Object x, Object gamma, Object beta, Object w1, Object b1,
      Object w2, ByteBuffer saved, Gradients<?, ?> out, float[] fp8State) {
    long t = x == null ? 0 : tokensOf("x", n(x));
    if (x != null) {
      len("dy", dy, n(x));
      len("dx", out.dx, n(x));
    }
    checkInputs(gamma, beta, w1, b1, w2, null, fp8State);
    checkSaved(saved, t);
    checkParamGrads(out);
    return t;
  }

  /** The lengths of the parameter gradients (the weight gradients' in either array type). */
  /** Checks each parameter gradient of {@code out} against the shape query: of its length, or null
   * where the plan has no such gradient. */
  private void checkParamGrads(Gradients<?, ?> out) {
    len("dgamma", n(out.dgamma), out.dgamma == null, elements(TENSOR_DGAMMA));
    len("dbeta", n(out.dbeta), out.dbeta == null, elements(TENSOR_DBETA));
    len("dw1", n(out.dw1), out.dw1 == null, elements(TENSOR_DW1));
    len("db1", n(out.db1), out.db1 == null, elements(TENSOR_DB1));
    len("dw2", n(out.dw2), out.dw2 == null, elements(TENSOR_DW2));
    len("db2", n(out.db2), out.db2 == null, elements(TENSOR_DB2));
  }

  /** The length of a float[] or short[] (0 for null). */
  private static int n(Object array) { return array == null ? 0 : Array.getLength(array); }

  // -- f32 plans: float[] tensors --

  /** Forward into y (x.length elements) for x.length / H tokens; writes saved (from
   * {@link #newSavedBuffer()}) for backward. */
  public void forward(float[] x, float[] gamma, float[] beta, float[] w1, float[] b1,
      float[] w2, float[] b2, float[] y, ByteBuffer saved) {
    forward(x, gamma, beta, w1, b1, w2, b2, y, saved, null, false);
  }

  /** Forward with a caller's FP8 state (DELAYED plans; null = the plan's), updated in place. */
  public void forward(float[] x, float[] gamma, float[] beta, float[] w1, float[] b1,
      float[] w2, float[] b2, float[] y, ByteBuffer saved, float[] fp8State) {
    forward(x, gamma, beta, w1, b1, w2, b2, y, saved, fp8State, false);
  }

  /** Forward (f32 plans) with a caller's FP8 state (DELAYED plans; null = the plan's) and
   * {@code weightsUnchanged}: w1 / w2 are as when the plan last made its copies of them, which the
   * call then reuses (LNMLP_CALL_WEIGHTS_UNCHANGED). */
  public synchronized void forward(float[] x, float[] gamma, float[] beta, float[] w1, float[] b1,
      float[] w2, float[] b2, float[] y, ByteBuffer saved, float[] fp8State,
      boolean weightsUnchanged) {
    PlanHandle h = live();
    requireF32("forward");
    long t = checkForward(x, gamma, beta, w1, b1, w2, b2, y, saved, fp8State);
    LnmlpNative.plan_forward(h, t, x, gamma, beta, w1, b1, w2, b2, y, saved, fp8State,
        flags(weightsUnchanged), 0L);
  }

  /** Forward; returns a new y (x.length elements: y's shape is x's, [t, H]). */
  public float[] forward(float[] x, float[] gamma, float[] beta, float[] w1, float[] b1,
      float[] w2, float[] b2, ByteBuffer saved) {
    float[] y = x == null ? null : new float[x.length];
    forward(x, gamma, beta, w1, b1, w2, b2, y, saved, null, false);
    return y;
  }

  /** Backward into caller arrays (null for the absent dbeta / db1 / db2); x.length / H tokens. */
  public void backward(float[] dy, float[] x, float[] gamma, float[] beta, float[] w1,
      float[] b1, float[] w2, ByteBuffer saved, Grads out) {
    backward(dy, x, gamma, beta, w1, b1, w2, saved, out, null, false);
  }

  /** Backward with a caller's FP8 state (DELAYED plans; null = the plan's), updated in place. */
  public void backward(float[] dy, float[] x, float[] gamma, float[] beta, float[] w1,
      float[] b1, float[] w2, ByteBuffer saved, Grads out, float[] fp8State) {
    backward(dy, x, gamma, beta, w1, b1, w2, saved, out, fp8State, false);
  }

  /** Backward (f32 plans) into the caller's arrays: dx, dgamma, dbeta overwritten; dw1, db1,
   * dw2, db2 overwritten, or added into when the plan accumulates. fp8State and
   * weightsUnchanged as for forward. */
  public synchronized void backward(float[] dy, float[] x, float[] gamma, float[] beta,
      float[] w1, float[] b1, float[] w2, ByteBuffer saved, Grads out, float[] fp8State,
      boolean weightsUnchanged) {
    PlanHandle h = live();
    requireF32("backward");
    requireGradDtype(DTYPE_F32, "Plan.Grads");
    long t = checkBackward(dy, x, gamma, beta, w1, b1, w2, saved, out, fp8State);
    LnmlpNative.plan_backward(h, t, dy, x, gamma, beta, w1, b1, w2, saved, out.dx, out.dgamma,
        out.dbeta, out.dw1, out.db1, out.dw2, out.db2, fp8State, flags(weightsUnchanged), 0L);
  }

  /** Backward; returns new gradient arrays (dx: x.length elements, dx's shape being x's). Refused
   * for a plan that accumulates: give it the arrays to add into. */
  public Grads backward(float[] dy, float[] x, float[] gamma, float[] beta, float[] w1, float[] b1,
      float[] w2, ByteBuffer saved) {
    Grads g;
    synchronized (this) {
      live();
      requireF32("backward");
      requireNotAccumulating();
      g = grads(x == null ? 0 : x.length);
    }
    backward(dy, x, gamma, beta, w1, b1, w2, saved, g, null, false);
    return g;
  }

  /** New zeroed gradient arrays of an f32 plan for a call with {@code tokens} tokens, sized by
   * the shape query (null for the gradients the plan does not have). */
  public synchronized Grads newGrads(long tokens) {
    live();
    requireF32("newGrads");
    return grads(arrayLength("dx", elements(TENSOR_DX, tokens)));
  }

  private Grads grads(int dxLength) {
    return new Grads(new float[dxLength], newFloats(TENSOR_DGAMMA), newFloats(TENSOR_DBETA),
        newFloats(TENSOR_DW1), newFloats(TENSOR_DB1), newFloats(TENSOR_DW2), newFloats(TENSOR_DB2));
  }

  /** A new array for a gradient, sized by the shape query; null when the plan has none. */
  private float[] newFloats(int tensor) {
    long n = elements(tensor);
    return n < 0 ? null : new float[arrayLength("gradient tensor " + tensor, n)];
  }

  private short[] newShorts(int tensor) {
    long n = elements(tensor);
    return n < 0 ? null : new short[arrayLength("gradient tensor " + tensor, n)];
  }

  // -- bf16 / f16 plans: short[] bit patterns --

  /** Forward of a bf16 / f16 plan (short[] bit patterns) into y (x.length elements); fp8State
   * (float[], DELAYED plans; null = the plan's) and weightsUnchanged as for the f32 forward. */
  public synchronized void forward(short[] x, short[] gamma, short[] beta, short[] w1, short[] b1,
      short[] w2, short[] b2, short[] y, ByteBuffer saved, float[] fp8State,
      boolean weightsUnchanged) {
    PlanHandle h = live();
    require16("forward");
    requireWeightDtype16("forward");
    long t = checkForward(x, gamma, beta, w1, b1, w2, b2, y, saved, fp8State);
    LnmlpNative.plan_forward_u16(h, t, x, gamma, beta, w1, b1, w2, b2, y, saved, fp8State,
        flags(weightsUnchanged), 0L);
  }

  /** Backward of a bf16 / f16 plan whose weight gradients are in its dtype (short[] all through). */
  public synchronized void backward(short[] dy, short[] x, short[] gamma, short[] beta,
      short[] w1, short[] b1, short[] w2, ByteBuffer saved, Grads16 out, float[] fp8State,
      boolean weightsUnchanged) {
    PlanHandle h = live();
    require16("backward");
    requireWeightDtype16("backward");
    requireGradDtype(dtype, "Plan.Grads16");
    long t = checkBackward(dy, x, gamma, beta, w1, b1, w2, saved, out, fp8State);
    LnmlpNative.plan_backward_u16(h, t, dy, x, gamma, beta, w1, b1, w2, saved, out.dx, out.dgamma,
        out.dbeta, out.dw1, out.db1, out.dw2, out.db2, fp8State, flags(weightsUnchanged), 0L);
  }

  /** Backward of a bf16 / f16 plan with fp32 weight gradients ({@code gradDtype(DTYPE_F32)}):
   * dw1, db1, dw2, db2 are float[] (added into when the plan accumulates), the rest short[]. */
  public synchronized void backward(short[] dy, short[] x, short[] gamma, short[] beta,
      short[] w1, short[] b1, short[] w2, ByteBuffer saved, MainGrads out, float[] fp8State,
      boolean weightsUnchanged) {
    PlanHandle h = live();
    require16("backward");
    requireWeightDtype16("backward");
    requireGradDtype(DTYPE_F32, "Plan.MainGrads");
    long t = checkBackward(dy, x, gamma, beta, w1, b1, w2, saved, out, fp8State);
    LnmlpNative.plan_backward_u16_f32grad(h, t, dy, x, gamma, beta, w1, b1, w2, saved, out.dx,
        out.dgamma, out.dbeta, out.dw1, out.db1, out.dw2, out.db2, fp8State,
        flags(weightsUnchanged), 0L);
  }

  /** New zeroed gradient arrays of a bf16 / f16 plan whose weight gradients are in its dtype. */
  public synchronized Grads16 newGrads16(long tokens) {
    live();
    require16("newGrads16");
    requireGradDtype(dtype, "Plan.Grads16");
    return new Grads16(new short[arrayLength("dx", elements(TENSOR_DX, tokens))],
        newShorts(TENSOR_DGAMMA), newShorts(TENSOR_DBETA), newShorts(TENSOR_DW1),
        newShorts(TENSOR_DB1), newShorts(TENSOR_DW2), newShorts(TENSOR_DB2));
  }

  /** New zeroed gradient arrays of a bf16 / f16 plan with fp32 weight gradients. */
  public synchronized MainGrads newMainGrads(long tokens) {
    live();
    require16("newMainGrads");
    requireGradDtype(DTYPE_F32, "Plan.MainGrads");
    return new MainGrads(new short[arrayLength("dx", elements(TENSOR_DX, tokens))],
        newShorts(TENSOR_DGAMMA), newShorts(TENSOR_DBETA), newFloats(TENSOR_DW1),
        newFloats(TENSOR_DB1), newFloats(TENSOR_DW2), newFloats(TENSOR_DB2));
  }

  // ---- the random state (stochastic rounding: NVFP4's gradients) -------------------------------

  /**
   * {seed, offset} of the stream the next backward that draws takes (unsigned 64-bit values in
   * longs of the same bits); each such backward moves offset on by one.
   */
  public synchronized long[] rngState() { return LnmlpNative.plan_get_rng_state(live()); }

  /** Sets the random state: a backward's draws follow from (seed, offset) alone. */
  public synchronized void setRngState(long seed, long offset) { LnmlpNative.plan_set_rng_state(live(), seed, offset); }

  /**
   * Where the plan's calls lie in the whole tensors the random stream is drawn over, for a split
   * done by the caller: tokens from firstToken of wholeTokens (0: the call's count), F part ffnPart
   * of ffnParts; the parts of a split then draw the unsplit call's bits.
   */
  public synchronized void setRngPlace(long firstToken, long wholeTokens, int ffnPart, int ffnParts) {
    LnmlpNative.plan_set_rng_place(live(), firstToken, wholeTokens, ffnPart, ffnParts);
  }

  // ---- FP8 quantizer state (DELAYED recipe) ----------------------------------------------------

  /** The scale of quantizer q (QUANTIZER_*). */
  public synchronized float quantizerScale(int q) {
    return LnmlpNative.plan_get_quantizer_state(live(), q, null);
  }

  /** The amax history of quantizer q, newest first (a copy). */
  public synchronized float[] amaxHistory(int q) {
    float[] h = new float[arrayLength("the amax history", amaxHistoryLength)];
    LnmlpNative.plan_get_quantizer_state(live(), q, h);
    return h;
  }

  /** Replaces quantizer q's scale and history (amaxHistoryLength() entries, newest first). */
  public synchronized void setQuantizerState(int q, float scale, float[] amaxHistory) {
    LnmlpNative.plan_set_quantizer_state(live(), q, scale, amaxHistory);
  }

  /**
   * A fresh FP8 state (DELAYED plans): float32 [QUANTIZER_COUNT, 1 + amaxHistoryLength()]
   * row-major (the shape query's TENSOR_FP8_STATE), each row a quantizer's scale (1) then its amax
   * history (0), newest first. Pass it to forward / backward as {@code fp8State}: that call uses and
   * updates it in place instead of the plan's state.
   */
  public synchronized float[] newFp8State() {
    long[] dims = LnmlpNative.plan_get_tensor_shape(live(), TENSOR_FP8_STATE, TOKENS_MAX, null);
    if (dims == null) {
      throw new LnmlpException(ERROR_INVALID_ARGUMENT,
          "this plan's recipe keeps no quantizer state (only RECIPE_DELAYED does)");
    }
    float[] s = new float[arrayLength("the FP8 state", dims[0] * dims[1])];
    for (int q = 0; q < dims[0]; q++) s[Math.toIntExact(q * dims[1])] = 1f;
    return s;
  }

  /** {@link #newFp8State()} in a direct buffer (native order), for {@link #attachFp8State}. */
  public ByteBuffer newFp8StateBuffer() {
    float[] s = newFp8State();
    ByteBuffer b = allocateAligned(4L * s.length, 16);
    b.asFloatBuffer().put(s);
    return b;
  }

  /**
   * Makes {@code state} (a direct buffer in native order holding {@link #newFp8State()}'s layout,
   * e.g. from {@link #newFp8StateBuffer()}) the plan's FP8 state from now on: forward / backward
   * without their own fp8State, the quantizer state functions, exportState and importState use and
   * update it in place. null goes back to the plan's own state (which kept its values). The Plan
   * keeps the buffer reachable while it is attached.
   */
  public synchronized void attachFp8State(ByteBuffer state) {
    PlanHandle h = live();
    if (state != null) {
      if (!state.isDirect()) {
        throw new LnmlpException(ERROR_INVALID_ARGUMENT,
            "the FP8 state must be a direct ByteBuffer (use Plan.newFp8StateBuffer())");
      }
      long n = elements(TENSOR_FP8_STATE);
      if (n >= 0 && state.capacity() < 4 * n) {
        throw new LnmlpException(ERROR_INVALID_ARGUMENT, "the FP8 state has " + state.capacity()
            + " bytes, but this plan's is " + 4 * n + " (use Plan.newFp8StateBuffer())");
      }
    }
    LnmlpNative.plan_attach_fp8_state(h, state);
    fp8State = state;
  }

  /** The whole quantizer state as a versioned blob; empty for stateless recipes. Experimental
   * (lnmlp_plan_export_state): the blob's format may change in any release; for a stable
   * checkpoint use {@link #quantizerScale} / {@link #amaxHistory} / {@link #setQuantizerState}. */
  public synchronized byte[] exportState() {
    PlanHandle h = live();
    byte[] blob = new byte[arrayLength("the state blob", stateBytes)];
    if (blob.length > 0) LnmlpNative.plan_export_state(h, blob);
    return blob;
  }

  /** Restores a blob from {@link #exportState()} of a plan with the same recipe and history.
   * Experimental (lnmlp_plan_import_state), as {@link #exportState()}. */
  public synchronized void importState(byte[] blob) {
    LnmlpNative.plan_import_state(live(), blob);
  }
}

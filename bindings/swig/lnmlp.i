/*
 * lnmlp.i -- SWIG interface over include/lnmlp.h, generating a Java (JNI) binding.
 *
 *     swig -java -package org.lnmlp -I<repo>/include -outdir <dir>/org/lnmlp -o lnmlp_wrap.c lnmlp.i
 *
 * (see bindings/swig/run_tests.sh for the whole build). The package must be org.lnmlp: the C
 * side throws org.lnmlp.LnmlpException (override with -DLNMLP_JAVA_EXCEPTION_CLASS=... when
 * compiling lnmlp_wrap.c if you generate into another package).
 *
 * What Java sees (class org.lnmlp.LnmlpNative, all static; org.lnmlp.Lnmlp / Plan are the
 * hand-written idiomatic layer on top):
 *  - every function of lnmlp.h, its "lnmlp_" prefix stripped: lnmlp_plan_create -> plan_create,
 *    the experimental tier's included (LNMLP_EXPERIMENTAL is defined for SWIG and for the wrapper:
 *    sharding, communicators, the state blob, BACKEND_CUDA and FEATURE_SHARDING; they may change
 *    in any release);
 *  - every enum constant and version macro as a compile-time int constant, its "LNMLP_" prefix
 *    stripped: LNMLP_ACT_GELU -> LnmlpNative.ACT_GELU, LNMLP_ABI_VERSION -> ABI_VERSION;
 *  - a status other than LNMLP_SUCCESS is thrown as org.lnmlp.LnmlpException (status code, its
 *    name, lnmlp_last_error()); functions return void or the value of their out-parameter:
 *      desc_create() -> DescHandle, plan_create(desc) -> PlanHandle, plan_get_*_bytes -> long,
 *      get_version() -> int[]{major, minor, patch, abi}, query_support -> boolean,
 *      get_build_info() -> String, plan_get_amax_history_length -> long,
 *      plan_get_quantizer_state(plan, q, float[] history) -> scale;
 *  - int64_t is long, int32_t int: desc_set_num_threads(desc, long),
 *    desc_set_delayed_scaling(desc, int margin, long amax_history_len, int algo),
 *    desc_set_sharding(desc, long group_size, long rank, int sequence_parallel);
 *  - (pointer, count) pairs become one Java array whose length is the count:
 *      desc_set_activations(desc, int[]), fp8_encode(dtype, float[] in, scale, byte[] out)
 *      (dtype DTYPE_FP8_E4M3 or DTYPE_FP8_E5M2),
 *      plan_set_quantizer_state(plan, q, scale, float[]), plan_export_state(plan, byte[]),
 *      plan_import_state(plan, byte[]), plan_attach_workspace(plan, direct ByteBuffer);
 *  - plan_forward / plan_backward take the call's tokens (long, 0 .. the plan's most) as C does;
 *    their tensors are float[] (f32 plans; null = C NULL); the saved buffer is a direct
 *    java.nio.ByteBuffer aligned to plan_get_alignment (its address is used, not its position);
 *    fp8_state is a float[] (DELAYED plans; null = the plan's state), read and written back;
 *    flags is an int (CALL_* OR'ed: CALL_DEFAULT, CALL_WEIGHTS_UNCHANGED); stream is a long (a
 *    cudaStream_t value, 0 for the CPU backend). Gradient arrays are read as well as written
 *    (their values go in and come back), so a plan that accumulates (desc_set_weight_gradients)
 *    adds into the Java arrays it is given.
 *    Variants: plan_forward_u16 / plan_backward_u16 (short[] bit patterns, bf16/f16 plans),
 *    plan_backward_u16_f32grad (bf16/f16 plans whose dW1, db1, dW2, db2 are F32: those four are
 *    float[], the rest short[]),
 *    plan_forward_direct / plan_backward_direct (direct ByteBuffers, any dtype, zero copy),
 *    plan_forward_ptr / plan_backward_ptr (raw addresses as long, e.g. CUDA device pointers);
 *  - plan_get_tensor_shape(plan, tensor, tokens, int[] dtype) -> long[] dims (its length is the
 *    rank; null where C says rank -1, the tensor not taken); dtype: null, or an int[1] that
 *    receives the element type;
 *  - plan_attach_fp8_state(plan, direct ByteBuffer or null): the array must stay put while
 *    attached, which a Java array does not; plan_attach_fp8_state_ptr takes a raw address.
 *
 * Like the C API, the low-level tensor functions do not check array lengths: an array shorter
 * than the call needs (plan_get_tensor_shape) is read or written out of bounds.
 * org.lnmlp.Plan checks every length; use it unless you need the raw calls.
 */
%module LnmlpNative

%{
#include <stdint.h>
#include <string.h>
#define LNMLP_EXPERIMENTAL /* the wrapper calls the experimental tier too */
#include "lnmlp.h"

#ifndef LNMLP_JAVA_EXCEPTION_CLASS
#define LNMLP_JAVA_EXCEPTION_CLASS "org/lnmlp/LnmlpException"
#endif

/* Leaves a pending org.lnmlp.LnmlpException(status, status name, last error message). */
static void lnmlp_jni_throw(JNIEnv* jenv, int32_t status) {
  jclass cls;
  jmethodID ctor;
  jstring name, msg;
  jobject ex;
  if ((*jenv)->ExceptionCheck(jenv)) return;
  cls = (*jenv)->FindClass(jenv, LNMLP_JAVA_EXCEPTION_CLASS);
  if (!cls) return; /* NoClassDefFoundError is pending */
  ctor = (*jenv)->GetMethodID(jenv, cls, "<init>", "(ILjava/lang/String;Ljava/lang/String;)V");
  if (!ctor) return;
  name = (*jenv)->NewStringUTF(jenv, lnmlp_status_string(status));
  if (!name) return;
  msg = (*jenv)->NewStringUTF(jenv, lnmlp_last_error());
  if (!msg) return;
  ex = (*jenv)->NewObject(jenv, cls, ctor, (jint)status, name, msg);
  if (ex) (*jenv)->Throw(jenv, (jthrowable)ex);
  (*jenv)->DeleteLocalRef(jenv, name);
  (*jenv)->DeleteLocalRef(jenv, msg);
  (*jenv)->DeleteLocalRef(jenv, cls);
}
%}

%include <stdint.i>

/* Load the JNI library: -Dlnmlp.jni.path, else the jar's own natives, else java.library.path
   (java/org/lnmlp/NativeLoader.java). */
%pragma(java) jniclasscode=%{
  static {
    NativeLoader.load();
  }
%}
%pragma(java) moduleclassmodifiers="public final class"
%pragma(java) modulecode=%{
  private LnmlpNative() {}
%}

/* ---- names --------------------------------------------------------------------------------- */
%rename("%(regex:/^(lnmlp|LNMLP)_(.+)$/\\2/)s") "";
%rename(DescHandle) lnmlp_desc;
%rename(PlanHandle) lnmlp_plan;
%rename(CommHandle) lnmlp_comm;
%javaconst(1);

/* The opaque handles become proxy classes without constructor or destructor: created only by
 * desc_create / plan_create, freed only by desc_destroy / plan_destroy. */
%nodefaultctor lnmlp_desc;
%nodefaultdtor lnmlp_desc;
%nodefaultctor lnmlp_plan;
%nodefaultdtor lnmlp_plan;
%nodefaultctor lnmlp_comm;
%nodefaultdtor lnmlp_comm;
struct lnmlp_desc {};
struct lnmlp_plan {};
struct lnmlp_comm {};
/* The callback table holds C function pointers, which Java cannot supply: not wrapped as a class
 * (comm_create_callbacks takes an opaque pointer to a table built in C, its struct_size set to
 * sizeof(lnmlp_comm_callbacks)). */
%ignore lnmlp_comm_callbacks;

/* ---- status -> exception ------------------------------------------------------------------------
 * Every int32_t-returning call: skipped when a typemap already left a Java exception pending
 * (a non-direct buffer, an out-of-memory pinning an array), thrown as LnmlpException when it
 * fails. Typemaps never return early, so every pinned array is released (argout) either way. */
%exception {
  if (!(*jenv)->ExceptionCheck(jenv)) {
    $action
    if (result != LNMLP_SUCCESS) lnmlp_jni_throw(jenv, result);
  } else {
    result = 0;
  }
}
%exception lnmlp_status_string "$action"
%exception lnmlp_last_error "$action"

/* Functions whose only result is the status: void in Java. */
%define LNMLP_RETURNS_VOID(FN)
%typemap(jni) int32_t FN "void"
%typemap(jtype) int32_t FN "void"
%typemap(jstype) int32_t FN "void"
%typemap(javaout) int32_t FN { $jnicall; }
%typemap(out) int32_t FN ""
%enddef

/* Functions returning one out-parameter; its argout typemap sets $result. */
%define LNMLP_RETURNS(FN, JNITYPE, JTYPE)
%typemap(jni) int32_t FN "JNITYPE"
%typemap(jtype) int32_t FN "JTYPE"
%typemap(jstype) int32_t FN "JTYPE"
%typemap(javaout) int32_t FN { return $jnicall; }
%typemap(out) int32_t FN ""
%enddef

%define LNMLP_RETURNS_HANDLE(FN, JCLASS)
%typemap(jni) int32_t FN "jlong"
%typemap(jtype) int32_t FN "long"
%typemap(jstype) int32_t FN "JCLASS"
%typemap(javaout) int32_t FN {
    long cPtr = $jnicall;
    return (cPtr == 0) ? null : new JCLASS(cPtr, false);
  }
%typemap(out) int32_t FN ""
%enddef

LNMLP_RETURNS(lnmlp_get_version, jintArray, int[])
LNMLP_RETURNS(lnmlp_query_support, jint, int)
LNMLP_RETURNS(lnmlp_get_build_info, jstring, String)
LNMLP_RETURNS_HANDLE(lnmlp_desc_create, DescHandle)
LNMLP_RETURNS_HANDLE(lnmlp_plan_create, PlanHandle)
/* Communicators (experimental): from an MPI_Comm's or ncclComm_t's address (long), or from a
 * callback table (C function pointers, built in C: Java cannot supply them). */
LNMLP_RETURNS_HANDLE(lnmlp_comm_create_callbacks, CommHandle)
LNMLP_RETURNS_HANDLE(lnmlp_comm_create_mpi, CommHandle)
LNMLP_RETURNS_HANDLE(lnmlp_comm_create_nccl, CommHandle)
LNMLP_RETURNS_VOID(lnmlp_comm_destroy)
LNMLP_RETURNS_VOID(lnmlp_desc_set_communicator)
LNMLP_RETURNS(lnmlp_plan_get_workspace_bytes, jlong, long)
LNMLP_RETURNS(lnmlp_plan_get_saved_bytes, jlong, long)
LNMLP_RETURNS(lnmlp_plan_get_saved_bytes_per_token, jlong, long)
LNMLP_RETURNS(lnmlp_plan_get_alignment, jlong, long)
LNMLP_RETURNS(lnmlp_plan_get_state_bytes, jlong, long)
LNMLP_RETURNS(lnmlp_plan_get_amax_history_length, jlong, long)
LNMLP_RETURNS(lnmlp_plan_get_quantizer_state, jfloat, float)
LNMLP_RETURNS(lnmlp_plan_get_tensor_shape, jlongArray, long[])
LNMLP_RETURNS(lnmlp_plan_get_saved_section, jlongArray, long[])
LNMLP_RETURNS(lnmlp_plan_get_deferred_bytes, jlong, long)
LNMLP_RETURNS(lnmlp_plan_get_rng_state, jlongArray, long[])

LNMLP_RETURNS_VOID(lnmlp_fp8_encode)
LNMLP_RETURNS_VOID(lnmlp_fp8_decode)
LNMLP_RETURNS_VOID(lnmlp_nvfp4_quantize)
LNMLP_RETURNS_VOID(lnmlp_nvfp4_dequantize)
LNMLP_RETURNS_VOID(lnmlp_desc_set_nvfp4_options)
LNMLP_RETURNS_VOID(lnmlp_plan_set_rng_state)
LNMLP_RETURNS_VOID(lnmlp_plan_set_rng_place)
LNMLP_RETURNS_VOID(lnmlp_desc_destroy)
LNMLP_RETURNS_VOID(lnmlp_desc_set_shape)
LNMLP_RETURNS_VOID(lnmlp_desc_set_norm)
LNMLP_RETURNS_VOID(lnmlp_desc_set_zero_centered_gamma)
LNMLP_RETURNS_VOID(lnmlp_desc_set_epsilon)
LNMLP_RETURNS_VOID(lnmlp_desc_set_activations)
LNMLP_RETURNS_VOID(lnmlp_desc_set_clamped_swiglu)
LNMLP_RETURNS_VOID(lnmlp_desc_set_bias)
LNMLP_RETURNS_VOID(lnmlp_desc_set_dtype)
LNMLP_RETURNS_VOID(lnmlp_desc_set_remat)
LNMLP_RETURNS_VOID(lnmlp_desc_set_backend)
LNMLP_RETURNS_VOID(lnmlp_desc_set_num_threads)
LNMLP_RETURNS_VOID(lnmlp_desc_set_recipe)
LNMLP_RETURNS_VOID(lnmlp_desc_set_fp8_format)
LNMLP_RETURNS_VOID(lnmlp_desc_set_delayed_scaling)
LNMLP_RETURNS_VOID(lnmlp_desc_set_scaling_options)
LNMLP_RETURNS_VOID(lnmlp_desc_set_sharding)
LNMLP_RETURNS_VOID(lnmlp_desc_set_weight_gradients)
LNMLP_RETURNS_VOID(lnmlp_desc_set_weight_dtype)
LNMLP_RETURNS_VOID(lnmlp_desc_set_weight_layout)
LNMLP_RETURNS_VOID(lnmlp_desc_set_external_workspace)
LNMLP_RETURNS_VOID(lnmlp_desc_set_prepared_tokens)
LNMLP_RETURNS_VOID(lnmlp_desc_set_norm_output)
LNMLP_RETURNS_VOID(lnmlp_desc_set_gemm_math)
LNMLP_RETURNS_VOID(lnmlp_plan_destroy)
LNMLP_RETURNS_VOID(lnmlp_plan_attach_workspace)
LNMLP_RETURNS_VOID(lnmlp_plan_attach_fp8_state)
LNMLP_RETURNS_VOID(lnmlp_plan_attach_fp8_state_ptr)
LNMLP_RETURNS_VOID(lnmlp_plan_set_quantizer_state)
LNMLP_RETURNS_VOID(lnmlp_plan_export_state)
LNMLP_RETURNS_VOID(lnmlp_plan_import_state)
LNMLP_RETURNS_VOID(lnmlp_plan_forward)
LNMLP_RETURNS_VOID(lnmlp_plan_backward)
LNMLP_RETURNS_VOID(lnmlp_plan_backward_data)
LNMLP_RETURNS_VOID(lnmlp_plan_backward_weights)
LNMLP_RETURNS_VOID(lnmlp_plan_forward_u16)
LNMLP_RETURNS_VOID(lnmlp_plan_backward_u16)
LNMLP_RETURNS_VOID(lnmlp_plan_backward_u16_f32grad)
LNMLP_RETURNS_VOID(lnmlp_plan_forward_direct)
LNMLP_RETURNS_VOID(lnmlp_plan_backward_direct)
LNMLP_RETURNS_VOID(lnmlp_plan_forward_ptr)
LNMLP_RETURNS_VOID(lnmlp_plan_backward_ptr)

/* ---- scalar out-parameters ---------------------------------------------------------------- */
%typemap(in, numinputs=0) (int32_t* major, int32_t* minor, int32_t* patch, int32_t* abi)
    (int32_t v_major = 0, int32_t v_minor = 0, int32_t v_patch = 0, int32_t v_abi = 0) {
  $1 = &v_major; $2 = &v_minor; $3 = &v_patch; $4 = &v_abi;
}
%typemap(argout) (int32_t* major, int32_t* minor, int32_t* patch, int32_t* abi) {
  if (!(*jenv)->ExceptionCheck(jenv)) {
    jint v[4];
    v[0] = v_major$argnum; v[1] = v_minor$argnum; v[2] = v_patch$argnum; v[3] = v_abi$argnum;
    $result = (*jenv)->NewIntArray(jenv, 4);
    if ($result) (*jenv)->SetIntArrayRegion(jenv, $result, 0, 4, v);
  }
}

%typemap(in, numinputs=0) int32_t* supported (int32_t v = 0) "$1 = &v;"
%typemap(argout) int32_t* supported "$result = (jint)v$argnum;" /* UNSUPPORTED, SUPPORTED, SUPPORTED_EMULATED */

%typemap(in, numinputs=0) const char** info (const char* v = NULL) "$1 = ($1_ltype)&v;"
%typemap(argout) const char** info {
  if (v$argnum && !(*jenv)->ExceptionCheck(jenv)) $result = (*jenv)->NewStringUTF(jenv, v$argnum);
}

%typemap(in, numinputs=0) lnmlp_desc** desc (lnmlp_desc* v = NULL) "$1 = &v;"
%typemap(argout) lnmlp_desc** desc "*(lnmlp_desc**)&$result = v$argnum;"
%typemap(in, numinputs=0) lnmlp_plan** plan (lnmlp_plan* v = NULL) "$1 = &v;"
%typemap(argout) lnmlp_plan** plan "*(lnmlp_plan**)&$result = v$argnum;"
%typemap(in, numinputs=0) lnmlp_comm** comm (lnmlp_comm* v = NULL) "$1 = &v;"
%typemap(argout) lnmlp_comm** comm "*(lnmlp_comm**)&$result = v$argnum;"

%typemap(in, numinputs=0) int64_t* bytes (int64_t v = 0) "$1 = &v;"
%typemap(argout) int64_t* bytes "$result = (jlong)v$argnum;"
%typemap(in, numinputs=0) int64_t* length (int64_t v = 0) "$1 = &v;"
%typemap(argout) int64_t* length "$result = (jlong)v$argnum;"
%typemap(in, numinputs=0) float* scale (float v = 0.0f) "$1 = &v;"
%typemap(argout) float* scale "$result = (jfloat)v$argnum;"

/* plan_get_tensor_shape: (rank, dims) become the returned long[] (length rank; null for rank -1);
 * dtype is an optional int[] (null, or at least 1 element) that receives the element type. */
%typemap(in, numinputs=0) (int64_t* rank, int64_t* dims)
    (int64_t v_rank = -1, int64_t v_dims[LNMLP_MAX_TENSOR_RANK]) {
  $1 = &v_rank;
  $2 = v_dims;
}
%typemap(argout) (int64_t* rank, int64_t* dims) {
  if (!(*jenv)->ExceptionCheck(jenv) && v_rank$argnum >= 0) {
    jlong v[LNMLP_MAX_TENSOR_RANK];
    int64_t k;
    for (k = 0; k < v_rank$argnum && k < LNMLP_MAX_TENSOR_RANK; ++k) v[k] = (jlong)v_dims$argnum[k];
    $result = (*jenv)->NewLongArray(jenv, (jsize)k);
    if ($result) (*jenv)->SetLongArrayRegion(jenv, $result, 0, (jsize)k, v);
  }
}
%typemap(jni) int32_t* dtype "jintArray"
%typemap(jtype) int32_t* dtype "int[]"
%typemap(jstype) int32_t* dtype "int[]"
%typemap(javain) int32_t* dtype "$javainput"
%typemap(in) int32_t* dtype (int32_t v = 0) {
  $1 = &v;
  if ($input && !(*jenv)->ExceptionCheck(jenv) && (*jenv)->GetArrayLength(jenv, $input) < 1)
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "dtype must be null or an int[1]");
}
%typemap(argout) int32_t* dtype {
  if ($input && !(*jenv)->ExceptionCheck(jenv)) {
    jint d = (jint)v$argnum;
    (*jenv)->SetIntArrayRegion(jenv, $input, 0, 1, &d);
  }
}

/* plan_get_saved_section: returns the section's dims as plan_get_tensor_shape does (null when the
 * plan does not save it); offset is an optional long[] (null, or at least 1 element) that receives
 * its byte offset (-1 when not saved). */
%typemap(jni) int64_t* offset "jlongArray"
%typemap(jtype) int64_t* offset "long[]"
%typemap(jstype) int64_t* offset "long[]"
%typemap(javain) int64_t* offset "$javainput"
%typemap(in) int64_t* offset (int64_t v = -1) {
  $1 = &v;
  if ($input && !(*jenv)->ExceptionCheck(jenv) && (*jenv)->GetArrayLength(jenv, $input) < 1)
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "offset must be null or a long[1]");
}
%typemap(argout) int64_t* offset {
  if ($input && !(*jenv)->ExceptionCheck(jenv)) {
    jlong o = (jlong)v$argnum;
    (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &o);
  }
}

/* The random state's unsigned 64-bit seed and offset travel as Java longs with the same bits
 * (a value >= 2^63 reads as negative); plan_get_rng_state returns long[] {seed, offset}. */
%typemap(jni) uint64_t "jlong"
%typemap(jtype) uint64_t "long"
%typemap(jstype) uint64_t "long"
%typemap(javain) uint64_t "$javainput"
%typemap(in) uint64_t "$1 = (uint64_t)$input;"
%typemap(in, numinputs=0) (uint64_t* seed, uint64_t* offset) (uint64_t v_seed = 0, uint64_t v_offset = 0) {
  $1 = &v_seed;
  $2 = &v_offset;
}
%typemap(argout) (uint64_t* seed, uint64_t* offset) {
  if (!(*jenv)->ExceptionCheck(jenv)) {
    jlong v[2] = {(jlong)v_seed$argnum, (jlong)v_offset$argnum};
    $result = (*jenv)->NewLongArray(jenv, 2);
    if ($result) (*jenv)->SetLongArrayRegion(jenv, $result, 0, 2, v);
  }
}

/* desc_set_prepared_tokens(desc, long[] tokens): count = tokens.length (0 for null). */
%typemap(jni) (int32_t count, const int64_t* tokens) "jlongArray"
%typemap(jtype) (int32_t count, const int64_t* tokens) "long[]"
%typemap(jstype) (int32_t count, const int64_t* tokens) "long[]"
%typemap(javain) (int32_t count, const int64_t* tokens) "$javainput"
%typemap(in) (int32_t count, const int64_t* tokens) {
  $1 = 0;
  $2 = NULL;
  if ($input && !(*jenv)->ExceptionCheck(jenv)) {
    $1 = (int32_t)(*jenv)->GetArrayLength(jenv, $input);
    $2 = ($2_ltype)(*jenv)->GetLongArrayElements(jenv, $input, NULL);
  }
}
%typemap(argout) (int32_t count, const int64_t* tokens) {
  if ($2) (*jenv)->ReleaseLongArrayElements(jenv, $input, (jlong*)$2, JNI_ABORT);
}
/* SWIG's int64_t is long long, the header's may be long: call with the header's type. */
%feature("action") lnmlp_desc_set_prepared_tokens
  "result = lnmlp_desc_set_prepared_tokens(arg1, arg2, (const int64_t*)arg3);"

/* ---- Java arrays ----------------------------------------------------------------------------
 * ARRAY_IN / ARRAY_OUT: a Java primitive array (null -> NULL), pinned or copied with
 * Get<T>ArrayElements and released after the call: inputs with JNI_ABORT (never copied back),
 * outputs with mode 0 (copied back; on failure the library left them unchanged). */
%define LNMLP_ARRAY(CTYPE, JNIARR, JARR, JELEM, FN, MODE)
%typemap(jni) CTYPE "JNIARR"
%typemap(jtype) CTYPE "JARR"
%typemap(jstype) CTYPE "JARR"
%typemap(javain) CTYPE "$javainput"
%typemap(in) CTYPE {
  $1 = NULL;
  if ($input && !(*jenv)->ExceptionCheck(jenv))
    $1 = ($1_ltype)(*jenv)->Get##FN##ArrayElements(jenv, $input, NULL);
}
%typemap(argout) CTYPE {
  if ($1) (*jenv)->Release##FN##ArrayElements(jenv, $input, (JELEM*)$1, MODE);
}
%enddef

/* (pointer, count): one array, count = its length (0 for null). */
%define LNMLP_ARRAY_N(CTYPE, NTYPE, JNIARR, JARR, JELEM, FN, MODE)
%typemap(jni) (CTYPE, NTYPE) "JNIARR"
%typemap(jtype) (CTYPE, NTYPE) "JARR"
%typemap(jstype) (CTYPE, NTYPE) "JARR"
%typemap(javain) (CTYPE, NTYPE) "$javainput"
%typemap(in) (CTYPE, NTYPE) {
  $1 = NULL;
  $2 = 0;
  if ($input && !(*jenv)->ExceptionCheck(jenv)) {
    $2 = ($2_ltype)(*jenv)->GetArrayLength(jenv, $input);
    $1 = ($1_ltype)(*jenv)->Get##FN##ArrayElements(jenv, $input, NULL);
  }
}
%typemap(argout) (CTYPE, NTYPE) {
  if ($1) (*jenv)->Release##FN##ArrayElements(jenv, $input, (JELEM*)$1, MODE);
}
%enddef

LNMLP_ARRAY(const void* F32_IN, jfloatArray, float[], jfloat, Float, JNI_ABORT)
LNMLP_ARRAY(void* F32_OUT, jfloatArray, float[], jfloat, Float, 0)
LNMLP_ARRAY(const uint16_t* U16_IN, jshortArray, short[], jshort, Short, JNI_ABORT)
LNMLP_ARRAY(uint16_t* U16_OUT, jshortArray, short[], jshort, Short, 0)

LNMLP_ARRAY_N(int64_t count, const int32_t* activations, jintArray, int[], jint, Int, JNI_ABORT)
LNMLP_ARRAY_N(float* amax_history, int64_t length, jfloatArray, float[], jfloat, Float, 0)
LNMLP_ARRAY_N(const float* amax_history, int64_t length, jfloatArray, float[], jfloat, Float, JNI_ABORT)
LNMLP_ARRAY_N(void* blob, int64_t bytes, jbyteArray, byte[], jbyte, Byte, 0)
LNMLP_ARRAY_N(const void* blob, int64_t bytes, jbyteArray, byte[], jbyte, Byte, JNI_ABORT)

/* desc_set_activations(desc, int64_t count, const int32_t* activations): the count comes first. */
%typemap(in) (int64_t count, const int32_t* activations) {
  $1 = 0;
  $2 = NULL;
  if ($input && !(*jenv)->ExceptionCheck(jenv)) {
    $1 = (int64_t)(*jenv)->GetArrayLength(jenv, $input);
    $2 = (int32_t*)(*jenv)->GetIntArrayElements(jenv, $input, NULL);
  }
}
%typemap(argout) (int64_t count, const int32_t* activations) {
  if ($2) (*jenv)->ReleaseIntArrayElements(jenv, $input, (jint*)$2, JNI_ABORT);
}

/* fp8_encode(dtype, float[] in, scale, byte[] out) and fp8_decode(dtype, byte[] in, scale_inv,
 * float[] out), dtype DTYPE_FP8_E4M3 or DTYPE_FP8_E5M2: count = in.length; out must hold at least
 * count elements, else IllegalArgumentException (the call is not made). */
LNMLP_ARRAY_N(const float* in, int64_t count, jfloatArray, float[], jfloat, Float, JNI_ABORT)
LNMLP_ARRAY_N(const uint8_t* in, int64_t count, jbyteArray, byte[], jbyte, Byte, JNI_ABORT)
LNMLP_ARRAY(uint8_t* out, jbyteArray, byte[], jbyte, Byte, 0)
LNMLP_ARRAY(float* out, jfloatArray, float[], jfloat, Float, 0)
%typemap(check) uint8_t* out, float* out {
  /* arg3 is `count` in both fp8_encode and fp8_decode, set from in.length above. */
  if (!(*jenv)->ExceptionCheck(jenv)) {
    jsize n = $input ? (*jenv)->GetArrayLength(jenv, $input) : 0;
    if ((int64_t)n < (int64_t)arg3)
      SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException,
                              "out is shorter than in (fp8_encode / fp8_decode write in.length elements)");
  }
}

/* nvfp4_quantize(float[] x, rows, cols, block_rows, global_amax, byte[] codes, byte[] scales) and
 * nvfp4_dequantize(byte[] codes, byte[] scales, rows, cols, global_amax, float[] values): every
 * array must hold what include/lnmlp.h gives for rows x cols (x and values rows * cols, codes
 * rows * ((cols + 1) / 2), scales rows * ((cols + 15) / 16)), else IllegalArgumentException (the
 * call is not made). A null array is passed as NULL, which the library refuses with its status. */
%{
/* Whether a non-null Java array holds fewer than rows * per_row elements. Shapes the library
 * refuses anyway (negative, overflowing) are left to it. */
static int lnmlp_java_too_short(JNIEnv* jenv, jarray a, int64_t rows, int64_t per_row) {
  if (!a || (*jenv)->ExceptionCheck(jenv) || rows < 0 || per_row <= 0 || rows > INT64_MAX / per_row) return 0;
  return (int64_t)(*jenv)->GetArrayLength(jenv, a) < rows * per_row;
}
%}
LNMLP_ARRAY(const float* x, jfloatArray, float[], jfloat, Float, JNI_ABORT)
LNMLP_ARRAY(uint8_t* codes, jbyteArray, byte[], jbyte, Byte, 0)
LNMLP_ARRAY(uint8_t* scales, jbyteArray, byte[], jbyte, Byte, 0)
LNMLP_ARRAY(const uint8_t* codes, jbyteArray, byte[], jbyte, Byte, JNI_ABORT)
LNMLP_ARRAY(const uint8_t* scales, jbyteArray, byte[], jbyte, Byte, JNI_ABORT)
LNMLP_ARRAY(float* values, jfloatArray, float[], jfloat, Float, 0)
/* In nvfp4_quantize rows and cols are arg2 and arg3; in nvfp4_dequantize arg3 and arg4. */
%typemap(check) const float* x {
  if (lnmlp_java_too_short(jenv, $input, arg2, arg3))
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "x is shorter than rows * cols");
}
%typemap(check) uint8_t* codes {
  if (lnmlp_java_too_short(jenv, $input, arg2, (arg3 + 1) / 2))
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "codes is shorter than rows * ((cols + 1) / 2)");
}
%typemap(check) uint8_t* scales {
  if (lnmlp_java_too_short(jenv, $input, arg2, (arg3 + 15) / 16))
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "scales is shorter than rows * ((cols + 15) / 16)");
}
%typemap(check) const uint8_t* codes {
  if (lnmlp_java_too_short(jenv, $input, arg3, (arg4 + 1) / 2))
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "codes is shorter than rows * ((cols + 1) / 2)");
}
%typemap(check) const uint8_t* scales {
  if (lnmlp_java_too_short(jenv, $input, arg3, (arg4 + 15) / 16))
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "scales is shorter than rows * ((cols + 15) / 16)");
}
%typemap(check) float* values {
  if (lnmlp_java_too_short(jenv, $input, arg3, arg4))
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "values is shorter than rows * cols");
}

/* Direct java.nio.ByteBuffer (null -> NULL); its address, not its position. */
%define LNMLP_DIRECT(CTYPE)
%typemap(jni) CTYPE "jobject"
%typemap(jtype) CTYPE "java.nio.ByteBuffer"
%typemap(jstype) CTYPE "java.nio.ByteBuffer"
%typemap(javain) CTYPE "$javainput"
%typemap(in) CTYPE {
  $1 = NULL;
  if ($input && !(*jenv)->ExceptionCheck(jenv)) {
    $1 = ($1_ltype)(*jenv)->GetDirectBufferAddress(jenv, $input);
    if (!$1)
      SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException,
                              "$1_name must be a direct java.nio.ByteBuffer (ByteBuffer.allocateDirect)");
  }
}
%enddef
LNMLP_DIRECT(const void* DIRECT)
LNMLP_DIRECT(void* DIRECT)

/* attach_workspace(plan, direct ByteBuffer): bytes = capacity. The caller keeps the buffer
 * reachable for as long as the plan uses it (org.lnmlp.Plan does). */
%typemap(jni) (void* workspace, int64_t bytes) "jobject"
%typemap(jtype) (void* workspace, int64_t bytes) "java.nio.ByteBuffer"
%typemap(jstype) (void* workspace, int64_t bytes) "java.nio.ByteBuffer"
%typemap(javain) (void* workspace, int64_t bytes) "$javainput"
%typemap(in) (void* workspace, int64_t bytes) {
  $1 = NULL;
  $2 = 0;
  if ($input && !(*jenv)->ExceptionCheck(jenv)) {
    $1 = (*jenv)->GetDirectBufferAddress(jenv, $input);
    $2 = (int64_t)(*jenv)->GetDirectBufferCapacity(jenv, $input);
    if (!$1)
      SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException,
                              "workspace must be a direct java.nio.ByteBuffer (ByteBuffer.allocateDirect)");
  }
}

/* Raw addresses as long (device pointers, cudaStream_t, memory from elsewhere). */
%typemap(jni) void* PTR, const void* PTR "jlong"
%typemap(jtype) void* PTR, const void* PTR "long"
%typemap(jstype) void* PTR, const void* PTR "long"
%typemap(javain) void* PTR, const void* PTR "$javainput"
%typemap(in) void* PTR, const void* PTR "$1 = ($1_ltype)(intptr_t)$input;"

/* plan_forward / plan_backward: float[] tensors, direct saved buffer, float[] fp8_state (written
 * back: the call updates it), long stream. attach_fp8_state: a direct buffer (it must not move). */
%apply const void* F32_IN { const void* x, const void* gamma, const void* beta, const void* w1,
                            const void* b1, const void* w2, const void* b2, const void* dy };
%apply void* F32_OUT { void* y, void* dx, void* dgamma, void* dbeta, void* dw1, void* db1,
                       void* dw2, void* db2, void* fp8_state };
%apply void* DIRECT { void* saved, void* state, void* deferred };
%apply const void* DIRECT { const void* saved, const void* deferred };
%apply void* PTR { void* stream };
%apply const void* PTR { const void* mpi_comm, const void* nccl_comm };

/* The experimental tier (sharding, communicators, the state blob, BACKEND_CUDA, FEATURE_SHARDING)
 * is declared only under LNMLP_EXPERIMENTAL: wrap it too (the wrapper code defines it as well, in
 * the %{ %} block above). It may change in any release; the Java docs say which calls are in it. */
#define LNMLP_EXPERIMENTAL
%include "lnmlp.h"

/* ---- typed variants of forward / backward ---------------------------------------------------- */
%clear const void* x, const void* gamma, const void* beta, const void* w1, const void* b1,
       const void* w2, const void* b2, const void* dy;
%clear void* y, void* dx, void* dgamma, void* dbeta, void* dw1, void* db1, void* dw2, void* db2;
/* fp8_state too: the _direct / _ptr variants' lnmlp_direct_t* / lnmlp_address_t* fp8_state would
 * otherwise reduce to void* fp8_state and pick up the float[] argout (a Release of a non-array). */
%clear void* fp8_state;
%apply void* F32_OUT { float* fp8_state };

/* bf16 / f16 plans: uint16_t bit patterns as short[] (the FP8 state stays a float[]). */
%apply const uint16_t* U16_IN { const uint16_t* x, const uint16_t* gamma, const uint16_t* beta,
                                const uint16_t* w1, const uint16_t* b1, const uint16_t* w2,
                                const uint16_t* b2, const uint16_t* dy };
%apply uint16_t* U16_OUT { uint16_t* y, uint16_t* dx, uint16_t* dgamma, uint16_t* dbeta,
                           uint16_t* dw1, uint16_t* db1, uint16_t* dw2, uint16_t* db2 };
%inline %{
int32_t lnmlp_plan_forward_u16(lnmlp_plan* plan, int64_t tokens, const uint16_t* x,
                               const uint16_t* gamma, const uint16_t* beta, const uint16_t* w1,
                               const uint16_t* b1, const uint16_t* w2, const uint16_t* b2,
                               uint16_t* y, void* saved, float* fp8_state, int32_t flags,
                               void* stream) {
  return lnmlp_plan_forward(plan, tokens, x, gamma, beta, w1, b1, w2, b2, y, saved, fp8_state,
                            flags, stream);
}
int32_t lnmlp_plan_backward_u16(lnmlp_plan* plan, int64_t tokens, const uint16_t* dy,
                                const uint16_t* x, const uint16_t* gamma, const uint16_t* beta,
                                const uint16_t* w1, const uint16_t* b1, const uint16_t* w2,
                                const void* saved, uint16_t* dx, uint16_t* dgamma,
                                uint16_t* dbeta, uint16_t* dw1, uint16_t* db1, uint16_t* dw2,
                                uint16_t* db2, float* fp8_state, int32_t flags, void* stream) {
  return lnmlp_plan_backward(plan, tokens, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma,
                             dbeta, dw1, db1, dw2, db2, fp8_state, flags, stream);
}
%}

/* bf16 / f16 plans whose weight gradients are fp32 (desc_set_weight_gradients(desc, accumulate,
 * DTYPE_F32), a "main_grad"): dW1, db1, dW2 and db2 are float[], the other tensors short[]. Like
 * every raw call it trusts the plan's dtypes: org.lnmlp.Plan checks them (the shape query's). */
%apply void* F32_OUT { float* dw1, float* db1, float* dw2, float* db2 };
%inline %{
int32_t lnmlp_plan_backward_u16_f32grad(lnmlp_plan* plan, int64_t tokens, const uint16_t* dy,
                                        const uint16_t* x, const uint16_t* gamma,
                                        const uint16_t* beta, const uint16_t* w1,
                                        const uint16_t* b1, const uint16_t* w2, const void* saved,
                                        uint16_t* dx, uint16_t* dgamma, uint16_t* dbeta,
                                        float* dw1, float* db1, float* dw2, float* db2,
                                        float* fp8_state, int32_t flags, void* stream) {
  return lnmlp_plan_backward(plan, tokens, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma,
                             dbeta, dw1, db1, dw2, db2, fp8_state, flags, stream);
}
%}
%clear float* dw1, float* db1, float* dw2, float* db2;

/* Any dtype, zero copy: every tensor a direct ByteBuffer in native byte order. */
%{
typedef void lnmlp_direct_t;
typedef void lnmlp_address_t;
%}
typedef void lnmlp_direct_t;
typedef void lnmlp_address_t;
%apply const void* DIRECT { const lnmlp_direct_t* };
%apply void* DIRECT { lnmlp_direct_t* };
%apply const void* PTR { const lnmlp_address_t* };
%apply void* PTR { lnmlp_address_t* };
%inline %{
int32_t lnmlp_plan_forward_direct(lnmlp_plan* plan, int64_t tokens, const lnmlp_direct_t* x,
                                  const lnmlp_direct_t* gamma, const lnmlp_direct_t* beta,
                                  const lnmlp_direct_t* w1, const lnmlp_direct_t* b1,
                                  const lnmlp_direct_t* w2, const lnmlp_direct_t* b2,
                                  lnmlp_direct_t* y, lnmlp_direct_t* saved,
                                  lnmlp_direct_t* fp8_state, int32_t flags, void* stream) {
  return lnmlp_plan_forward(plan, tokens, x, gamma, beta, w1, b1, w2, b2, y, saved, fp8_state,
                            flags, stream);
}
int32_t lnmlp_plan_backward_direct(lnmlp_plan* plan, int64_t tokens, const lnmlp_direct_t* dy,
                                   const lnmlp_direct_t* x, const lnmlp_direct_t* gamma,
                                   const lnmlp_direct_t* beta, const lnmlp_direct_t* w1,
                                   const lnmlp_direct_t* b1, const lnmlp_direct_t* w2,
                                   const lnmlp_direct_t* saved, lnmlp_direct_t* dx,
                                   lnmlp_direct_t* dgamma, lnmlp_direct_t* dbeta,
                                   lnmlp_direct_t* dw1, lnmlp_direct_t* db1, lnmlp_direct_t* dw2,
                                   lnmlp_direct_t* db2, lnmlp_direct_t* fp8_state, int32_t flags,
                                   void* stream) {
  return lnmlp_plan_backward(plan, tokens, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma,
                             dbeta, dw1, db1, dw2, db2, fp8_state, flags, stream);
}
int32_t lnmlp_plan_forward_ptr(lnmlp_plan* plan, int64_t tokens, const lnmlp_address_t* x,
                               const lnmlp_address_t* gamma, const lnmlp_address_t* beta,
                               const lnmlp_address_t* w1, const lnmlp_address_t* b1,
                               const lnmlp_address_t* w2, const lnmlp_address_t* b2,
                               lnmlp_address_t* y, lnmlp_address_t* saved,
                               lnmlp_address_t* fp8_state, int32_t flags, void* stream) {
  return lnmlp_plan_forward(plan, tokens, x, gamma, beta, w1, b1, w2, b2, y, saved, fp8_state,
                            flags, stream);
}
int32_t lnmlp_plan_backward_ptr(lnmlp_plan* plan, int64_t tokens, const lnmlp_address_t* dy,
                                const lnmlp_address_t* x, const lnmlp_address_t* gamma,
                                const lnmlp_address_t* beta, const lnmlp_address_t* w1,
                                const lnmlp_address_t* b1, const lnmlp_address_t* w2,
                                const lnmlp_address_t* saved, lnmlp_address_t* dx,
                                lnmlp_address_t* dgamma, lnmlp_address_t* dbeta,
                                lnmlp_address_t* dw1, lnmlp_address_t* db1, lnmlp_address_t* dw2,
                                lnmlp_address_t* db2, lnmlp_address_t* fp8_state, int32_t flags,
                                void* stream) {
  return lnmlp_plan_backward(plan, tokens, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma,
                             dbeta, dw1, db1, dw2, db2, fp8_state, flags, stream);
}
/* attach_fp8_state with a raw address (device memory for the CUDA backend; 0 = the plan's own). */
int32_t lnmlp_plan_attach_fp8_state_ptr(lnmlp_plan* plan, lnmlp_address_t* state) {
  return lnmlp_plan_attach_fp8_state(plan, state);
}
%}

package org.lnmlp;

/**
 * A failed lnmlp call: the C status code (one of the {@code LnmlpNative.ERROR_*} constants), its
 * name ({@code "LNMLP_ERROR_NULL_POINTER"}) and the library's message for it
 * ({@code lnmlp_last_error()}, e.g. "x is NULL, but forward needs it").
 *
 * <p>Thrown by every {@link LnmlpNative} function whose C status is not {@code SUCCESS}, and by
 * {@link Plan} for arguments it rejects before calling C (with the status the C library would
 * have reported).
 */
public class LnmlpException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final int status;
  private final String statusName;
  private final String detail;

  /** Called from JNI (lnmlp_wrap.c): status, lnmlp_status_string(status), lnmlp_last_error(). */
  public LnmlpException(int status, String statusName, String detail) {
    super(statusName + ": " + detail);
    this.status = status;
    this.statusName = statusName;
    this.detail = detail;
  }

  /** An exception raised on the Java side, with the status name looked up in the library. */
  public LnmlpException(int status, String detail) {
    this(status, LnmlpNative.status_string(status), detail);
  }

  /** The C status code, an {@code LnmlpNative.ERROR_*} constant. */
  public int getStatus() {
    return status;
  }

  /** The status code's name, e.g. {@code "LNMLP_ERROR_INVALID_ARGUMENT"}. */
  public String getStatusName() {
    return statusName;
  }

  /** The library's message alone (lnmlp_last_error() at the time of the failure). */
  public String getDetail() {
    return detail;
  }
}

package org.lnmlp;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * Loads the JNI glue, liblnmlp_jni, once, from the first of:
 *
 * <ol>
 *   <li>the system property {@code lnmlp.jni.path}, an absolute path to a liblnmlp_jni.so built
 *       by hand;
 *   <li>the jar this class came from: {@code org/lnmlp/native/<os>-<arch>/} holds the glue,
 *       liblnmlp and the libraries it needs (oneDNN, the OpenMP runtime), each found by the others
 *       through an rpath of $ORIGIN, and a file {@code files} listing them. They are copied into a
 *       new temporary directory (removed when the JVM exits) and the glue is loaded from there:
 *       the loader cannot map a library from inside a jar;
 *   <li>{@code System.loadLibrary("lnmlp_jni")}, i.e. {@code java.library.path}.
 * </ol>
 */
final class NativeLoader {
  private static boolean loaded;

  private NativeLoader() {}

  static synchronized void load() {
    if (loaded) return;
    String path = System.getProperty("lnmlp.jni.path");
    if (path != null && !path.isEmpty()) {
      System.load(path);
    } else {
      String platform = platform();
      String resources = "/org/lnmlp/native/" + platform + "/";
      List<String> files = listing(resources + "files");
      if (files != null) {
        System.load(extract(resources, files).resolve("liblnmlp_jni.so").toString());
      } else {
        try {
          System.loadLibrary("lnmlp_jni");
        } catch (UnsatisfiedLinkError e) {
          UnsatisfiedLinkError clear = new UnsatisfiedLinkError(
              "lnmlp: no native library for " + platform + " in this jar (it carries "
                  + "org/lnmlp/native/<os>-<arch>/ for the platforms it was built on), none at "
                  + "-Dlnmlp.jni.path, and " + e.getMessage());
          clear.initCause(e);
          throw clear;
        }
      }
    }
    loaded = true;
  }

  /** "linux-x86_64", "linux-aarch64", ...: the directory name the jar's build gives its natives. */
  static String platform() {
    String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT);
    String arch = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
    if (os.startsWith("linux")) os = "linux";
    if (arch.equals("amd64") || arch.equals("x86-64")) arch = "x86_64";
    if (arch.equals("arm64")) arch = "aarch64";
    return os + "-" + arch;
  }

  /** The names in the resource {@code name}, one per line; null if the jar has no such file. */
  private static List<String> listing(String name) {
    InputStream in = NativeLoader.class.getResourceAsStream(name);
    if (in == null) return null;
    List<String> names = new ArrayList<>();
    try (BufferedReader r = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8))) {
      for (String line; (line = r.readLine()) != null; ) {
        if (!line.isBlank()) names.add(line.trim());
      }
    } catch (IOException e) {
      throw linkError("cannot read " + name + " from the jar", e);
    }
    return names;
  }

  private static Path extract(String resources, List<String> files) {
    try {
      Path dir = Files.createTempDirectory("lnmlp-native-");
      dir.toFile().deleteOnExit(); // registered first, so deleted after the files in it
      for (String file : files) {
        Path target = dir.resolve(file);
        try (InputStream in = NativeLoader.class.getResourceAsStream(resources + file)) {
          if (in == null) throw new IOException("the jar lists " + file + " but lacks it");
          Files.copy(in, target, StandardCopyOption.REPLACE_EXISTING);
        }
        target.toFile().deleteOnExit();
      }
      return dir;
    } catch (IOException e) {
      throw linkError("cannot copy the native libraries out of the jar", e);
    }
  }

  private static UnsatisfiedLinkError linkError(String what, Throwable cause) {
    UnsatisfiedLinkError e = new UnsatisfiedLinkError("lnmlp: " + what + ": " + cause.getMessage());
    e.initCause(cause);
    return e;
  }
}

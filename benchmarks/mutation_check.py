"""Mutation check of the reliability guards: remove each guard, run the tests, expect a failure.

Each entry below neutralises one guard of issue 11 (an output check, a validation, a signal path)
with a textual patch in a temporary copy of the tree, runs the named tests there (``pytest -x``),
and reports whether a test failed ("killed") or everything still passed ("SURVIVED": no test would
notice that guard gone). The working tree is never modified.

    python benchmarks/mutation_check.py                 # all guards
    python benchmarks/mutation_check.py --only stdout   # guards whose name contains "stdout"
    python benchmarks/mutation_check.py --list

Exit status 0 when every mutation is killed, 1 otherwise (2 when a patch no longer applies: the
guard's code changed and this table needs updating).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
REL = "tests/reliability"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # file in the tree
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...] = (REL,)


M = Mutation
MUTATIONS: list[Mutation] = [
    # defect 1: outputs against inputs and each other
    M("output-is-an-input", "trtq/outputs.py", "            if _same(path, in_path):", "            if False:"),
    M("two-outputs-same-file", "trtq/outputs.py", "            if _same(path, other):", "            if False:"),
    M(
        "same-file-by-inode (links)",
        "trtq/outputs.py",
        "    if ia == ib:\n        return True",
        "    if False:\n        return True",
    ),
    M(
        "unwritable-output-folder",
        "trtq/outputs.py",
        "        problem = _writable_folder(path)",
        "        problem = None",
    ),
    # defect 2: special files
    M(
        "non-regular-target",
        "trtq/fileio.py",
        "    kind = non_regular_kind(dest)\n    if kind:\n        raise UsageError",
        "    kind = ''\n    if kind:\n        raise UsageError",
    ),
    # defect 6 / atomic writes: OS errors while writing, temporary files
    M(
        "write-error-one-line",
        "trtq/fileio.py",
        "        _discard_temp(tmp)\n        if isinstance(e, OSError):\n            raise write_error(dest, e) from None",
        "        _discard_temp(tmp)\n        if False:\n            raise write_error(dest, e) from None",
    ),
    M(
        "temp-file-removed-on-failure",
        "trtq/fileio.py",
        "    except BaseException as e:\n        _discard_temp(tmp)",
        "    except BaseException as e:\n        _forget(tmp)",
    ),
    M("disk-full-hint", "trtq/fileio.py", "    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):", "    if False:"),
    # defect 3: scales
    M(
        "cache-scale-range",
        "trtq/calib/cache.py",
        '        problem = scale_problem(value / INT8_MAX if what == "amax" else value)',
        "        problem = None",
    ),
    M("cache-denormal-scale", "trtq/calib/cache.py", "    if scale < _FLOAT32_TINY:", "    if False:"),
    M("cache-huge-scale", "trtq/calib/cache.py", "    if scale > MAX_SCALE:", "    if False:"),
    M(
        "cache-non-finite",
        "trtq/calib/cache.py",
        "        if not allow_nonfinite:\n            raise _bad(\n",
        "        if False:\n            raise _bad(\n",
    ),
    M(
        "inspect-unusable-verdict",
        "trtq/calib/cache_inspect.py",
        '    elif unusable:\n        verdict = "unusable"',
        '    elif False:\n        verdict = "unusable"',
    ),
    # defect 4: unreadable sub-folders
    M("unreadable-subfolder", "trtq/data/sources.py", "    for e in errors:", "    for e in []:"),
    # defect 5: providers, stdout
    M(
        "providers-validated",
        "trtq/calib/collect/exposed.py",
        "        if name not in available:\n            raise ConfigError(\n                f\"ONNX Runtime provider '{name}'",
        "        if False:\n            raise ConfigError(\n                f\"ONNX Runtime provider '{name}'",
    ),
    M("stdout-guard", "trtq/cli/settings.py", "    process.stdout_guard.engage()\n    ctx = click", "    ctx = click"),
    # defect 6: environment problems
    M(
        "non-utf8-config",
        "trtq/config.py",
        '        text = raw.decode("utf-8")\n    except UnicodeDecodeError as e:',
        '        text = raw.decode("utf-8")\n    except ZeroDivisionError as e:',
    ),
    M("absurd-batch-size", "trtq/data/batcher.py", "        if total > limit:", "        if False:"),
    M(
        "missing-dependency-exit-4",
        "trtq/cli/process.py",
        "    except ImportError as e:  # a dependency",
        "    except ZeroDivisionError as e:  # a dependency",
    ),
    # defect 7: signals
    M(
        "sigterm-handled",
        "trtq/cli/process.py",
        "        for sig in (signal.SIGINT, signal.SIGTERM):\n            previous[sig]",
        "        for sig in (signal.SIGINT,):\n            previous[sig]",
    ),
    M(
        "second-signal-exits-at-once",
        "trtq/cli/process.py",
        "    if interrupt.requested() is not None and not again:",
        "    if False:",
    ),
    M(
        "signal-in-import-deferred",
        "trtq/cli/process.py",
        "    if _in_import(frame) or _in_finalizer(frame):",
        "    if _in_finalizer(frame):",
    ),
    M(
        "signal-in-finalizer-deferred",
        "trtq/cli/process.py",
        "    if _in_import(frame) or _in_finalizer(frame):",
        "    if _in_import(frame):",
    ),
    M(
        "swallowed-interrupt-raised-again",
        "trtq/interrupt.py",
        '    """Raise again when a signal arrived whose exception was swallowed somewhere."""\n    raise_requested()',
        '    """Raise again when a signal arrived whose exception was swallowed somewhere."""',
    ),
    M(
        "final-outputs-written-as-one-step",
        "trtq/cli/process.py",
        "    if interrupt.holding():  # final outputs",
        "    if False:  # final outputs",
    ),
    M(
        "signal-watchdog (main thread stuck)",
        "trtq/cli/process.py",
        "            if argv is None:  # the real process (in-process callers keep their own signal handling)\n"
        "                start_signal_watchdog()",
        "            if False:\n                start_signal_watchdog()",
        ("tests/reliability/test_signals.py",),
    ),
    M(
        "signal-before-the-command-runs",
        "trtq/cli/process.py",
        "        except KeyboardInterrupt as e:  # a signal once the handlers were in place",
        "        except ZeroDivisionError as e:  # a signal once the handlers were in place",
        ("tests/reliability/test_signals.py",),
    ),
    M(
        "signal-during-tensorrt-deferred",
        "trtq/cli/process.py",
        "    if interrupt.deferring():  # inside TensorRT",
        "    if False:  # inside TensorRT",
        ("tests/trt/test_build_signals.py",),
    ),
    M(
        "tensorrt-build-runs-deferred",
        "trtq/trt/build.py",
        "    with interrupt.deferred():  # signals are raised",
        "    if True:  # signals are raised",
        ("tests/trt/test_build_signals.py",),
    ),
    M(
        "temp-files-removed-when-a-command-ends",
        "trtq/cli/process.py",
        "            remove_pending_temp_files()\n            remove_temp_models()",
        "            remove_temp_models()",
    ),
    # defect 8: messages
    M(
        "data-names-an-unknown-input",
        "trtq/cli/settings.py",
        "        if sep and name not in by_name and _looks_like_input_name(name) and not Path(item).exists():",
        "        if False:",
    ),
    M("data-input-given-twice", "trtq/cli/settings.py", "        if name in given:", "        if False:"),
    M("yaml-duplicate-keys", "trtq/config.py", "                if first is not None:", "                if False:"),
    M(
        "integer-npy-note",
        "trtq/data/sources.py",
        '        if dt.kind in "biu" and self.dtype.kind == "f":',
        "        if False:",
    ),
    M(
        "tactic-sources-as-a-string",
        "trtq/config.py",
        "        if csv and isinstance(value, str):",
        "        if False:",
    ),
    M(
        "bench-checks-files-before-tensorrt",
        "trtq/pipeline/bench.py",
        '        if not Path(p).exists():\n            raise ModelError(f"engine not found',
        '        if False:\n            raise ModelError(f"engine not found',
    ),
    M(
        "pickled-npy-refused",
        "trtq/data/sources.py",
        '            if magic[:1] == b"\\x80":',
        "            if False:",
        (REL, "tests/data/test_data_sources.py"),
    ),
    M(
        "npy-file-opened-once",
        "trtq/data/sources.py",
        "        with self._open_lock:\n            arr = self._cached(f)",
        "        if True:\n            arr = self._cached(f)",
        ("tests/data/test_data_sources.py",),
    ),
    M(
        "budget-slices-rows",
        "trtq/calib/collect/budgeted.py",
        "if split_rows and rows < batch",
        "if False and rows < batch",
        ("tests/calib/test_budget.py",),
    ),
    M(
        "probe-within-target",
        "trtq/calib/collect/batch_one.py",
        "same, why = probe(model, wide, tensors, providers, budget, first, rows, any_axis=any_axis)",
        "same, why = probe(model, wide, tensors, providers, budget, first, any_axis=any_axis)",
        ("tests/calib/test_budget.py",),
    ),
    M(
        "float-layers-task-ranked",
        "trtq/pipeline/quantize.py",
        "    tasks = task_options or CompareOptions()\n",
        "    tasks = None\n",
        ("tests/quantize/test_rounding.py",),
    ),
    M(
        "probe-skipped-at-one-row",
        "trtq/calib/collect/batch_one.py",
        "    if rows == 1:",
        "    if rows == 0:",
        ("tests/calib/test_budget.py",),
    ),
    # one-pass histograms: a range that grows must merge runs of bins, not keep the old counts
    M(
        "pow2-regrow-merges",
        "trtq/calib/collect/one_pass.py",
        "            self.counts[name] = regrow(self.counts[name], e - old)",
        "            pass",
        ("tests/calib/test_one_pass.py",),
    ),
    # the stride is per sample: a whole-batch stride would depend on the batch size
    M(
        "pow2-stride-per-sample",
        "trtq/calib/collect/one_pass.py",
        "            rows = 1 if self.one_sample_calls else a.shape[0]",
        "            rows = 1",
        ("tests/calib/test_one_pass.py",),
    ),
    # a prime stride: the smallest integer would line up with rows and channels
    M(
        "pow2-stride-prime",
        "trtq/calib/collect/one_pass.py",
        "        if all(k % p for p in range(2, int(math.isqrt(k)) + 1)) and all(",
        "        if True and all(",
        ("tests/calib/test_one_pass.py",),
    ),
    # a --tensors qdq cache has no range for most tensors: an implicit build must refuse it
    M(
        "qdq-cache-not-implicit",
        "trtq/pipeline/build.py",
        'if ((prov.get("collection") or {}).get("tensors")) == "qdq":',
        "if False:",
        ("tests/pipeline/test_calibrate_qdq_tensors.py",),
    ),
    # the qdq set is the activation pairs of the plan, not the weights too
    M(
        "qdq-tensors-activations-only",
        "trtq/quantize/__init__.py",
        "wanted = {pair.tensor for pair in plan.pairs.values() if not pair.weight}",
        "wanted = {pair.tensor for pair in plan.pairs.values()} | set(available[:3])",
        ("tests/pipeline/test_calibrate_qdq_tensors.py",),
    ),
    # the compiled kernels (trtq/calib/collect/_kernels.c, rebuilt in the copy): in one read, a block that
    # raises the range must merge the lanes' bins; its blocks must start on the stride, or a row's picks
    # depend on the block size
    M(
        "native-pow2-regrow",
        "trtq/calib/collect/_kernels.c",
        "                            lane[b >> d] += c;",
        "                            lane[b] += c;",
        ("tests/calib/test_one_pass.py",),
    ),
    M(
        "native-blocks-on-stride",
        "trtq/calib/collect/_kernels.c",
        "    return stride <= BLOCK / 4 ? BLOCK - BLOCK % stride : stride * 4;",
        "    return BLOCK;",
        ("tests/calib/test_one_pass.py",),
    ),
    M(
        "native-histogram-flags-past-top",
        "trtq/calib/collect/_kernels.c",
        "        *exceeded |= y >= exceed_at;\n",
        "",
        ("tests/calib/test_kernels.py",),
    ),
    M(
        "native-histogram-max-of-counted",
        "trtq/calib/collect/_kernels.c",
        "block_max_bits_strided((const int32_t *)(xr + s), len, stride)",
        "block_max_bits((const int32_t *)(xr + s), len)",
        ("tests/calib/test_kernels.py",),
    ),
    # ... the AVX2 loops count zeros and the tail past the last eight as the scalar ones do
    M(
        "native-avx2-zeros",
        "trtq/calib/collect/_kernels.c",
        "            zeros -= z[i];",
        "            zeros += 0;",
        ("tests/calib/test_kernels.py",),
    ),
    M(
        "native-avx2-tail",
        "trtq/calib/collect/_kernels.c",
        "return zeros + (p < n ? SCALAR(seg + p, n - p, 1, scale, lanes, nb) : 0);",
        "return zeros;",
        ("tests/calib/test_kernels.py",),
    ),
    M(
        "native-level-sums-weights",
        "trtq/calib/collect/_kernels.c",
        "                b[t] += w * r0[t];",
        "                b[t] += r0[t];",
        ("tests/calib/test_search.py",),
    ),
    # the in-graph statistics operator (trtq/calib/collect/_ingraph.c): the same rules as Pow2Histograms
    M(
        "ingraph-padding-rows",
        "trtq/calib/collect/_ingraph_fold.c",
        "if (ndims > 0 && lead == c->batch && c->valid < c->batch && lead > 0)",
        "if (0)",
        ("tests/calib/test_ingraph.py",),
    ),
    M(
        "ingraph-stride-not-a-dim",
        "trtq/calib/collect/_ingraph_fold.c",
        "            ok = dims[i] <= 0 || dims[i] % k != 0;",
        "            ok = 1;",
        ("tests/calib/test_ingraph.py",),
    ),
    M(
        "ingraph-task-ranges-merged",
        "trtq/calib/collect/_ingraph_fold.c",
        "                d = s->e - w->e;",
        "                d = 0;",
        ("tests/calib/test_ingraph.py",),
    ),
    M(
        "ingraph-float64-below-range",
        "trtq/calib/collect/_ingraph_fold.c",
        "    if (s->e != NO_EXPONENT && s->e < MIN_EXP) {",
        "    if (0) {",
        ("tests/calib/test_ingraph.py",),
    ),
    M(
        "ingraph-tiny-recount",
        "trtq/calib/collect/_ingraph_fold.c",
        "    if (trouble == POW2_TINY)",
        "    if (0)",
        ("tests/calib/test_ingraph.py",),
    ),
    # ... the threads' counts merged up to each one's top bin, and a worker's trouble not lost
    M(
        "ingraph-merge-to-top-bin",
        "trtq/calib/collect/_ingraph_fold.c",
        "    return y < (float)(nb - 1) ? (int64_t)y : nb - 1;",
        "    return y < (float)(nb - 1) ? (int64_t)y - 1 : nb - 2;",
        ("tests/calib/test_ingraph.py",),
    ),
    M(
        "ingraph-worker-trouble",
        "trtq/calib/collect/_ingraph_fold.c",
        "        if (c->workers[i].status != POW2_OK)\n            return c->workers[i].status;",
        "        if (0)\n            return c->workers[i].status;",
        ("tests/calib/test_ingraph.py",),
    ),
    M(
        "ingraph-extremes-min",
        "trtq/calib/collect/_ingraph_fold.c",
        "        kmin = k < kmin ? k : kmin;\n",
        "",
        ("tests/calib/test_ingraph.py",),
    ),
    M(
        "ingraph-range-zero-flags",
        "trtq/calib/collect/_ingraph_fold.c",
        "        s->exceeded |= nonzero > 0;\n",
        "",
        ("tests/calib/test_ingraph.py",),
    ),
    M(
        "ingraph-fixed-past-range-flagged",
        "trtq/calib/collect/_ingraph_fold.c",
        "            s->exceeded |= w->exceeded;\n",
        "",
        ("tests/calib/test_ingraph.py",),
    ),
    # ... and a free batch dim runs no padding rows (attention's [3, N, ...] tensors)
    M(
        "no-padding-rows-run",
        "trtq/calib/collect/budgeted.py",
        "    if free and valid is not None and valid < rows:",
        "    if False:",
        ("tests/calib/test_ingraph.py",),
    ),
    # zero-padded tensors from the tensor they pad: the zeros added, at the input's sampling rate
    M(
        "padded-zeros-added",
        "trtq/calib/collect/padded.py",
        "        counts[name][0] += extra\n        zeros[name] = int(",
        "        zeros[name] = int(",
        ("tests/calib/test_padded.py",),
    ),
    M(
        "padded-pow2-zeros-added",
        "trtq/calib/collect/padded.py",
        "        counts[name][0] += extra\n        zeros[name] = zeros[src]",
        "        zeros[name] = zeros[src]",
        ("tests/calib/test_padded.py",),
    ),
    M(
        "padded-sampled-rate",
        "trtq/calib/collect/padded.py",
        "extra = int(samples) * -(-link.zeros_per_sample // k)",
        "extra = int(samples) * link.zeros_per_sample",
        ("tests/calib/test_padded.py",),
    ),
    M(
        "padded-batch-axis",
        "trtq/calib/collect/padded.py",
        "if pads is None or pads[0] or pads[rank]:",
        "if pads is None:",
        ("tests/calib/test_padded.py",),
    ),
    # channel equalization (quantize --equalize): only exact rewrites, re-measured amax, the user's task
    M(
        "equalize-one-reader-only",
        "trtq/quantize/equalize.py",
        "        if node is None or index.fan_out(name) != 1 or index.elem_type(name) not in (None, FLOAT):",
        "        if node is None or index.elem_type(name) not in (None, FLOAT):",
        ("tests/quantize/test_equalize.py",),
    ),
    M(
        "equalize-clip-not-homogeneous",
        "trtq/quantize/equalize.py",
        '"GlobalMaxPool"}',
        '"GlobalMaxPool", "Clip"}',
        ("tests/quantize/test_equalize.py",),
    ),
    M(
        "equalize-add-scales-both-inputs",
        "trtq/quantize/equalize.py",
        "            name = node.input[1 - slot]\n",
        "            return scaled, folds\n",
        ("tests/quantize/test_equalize.py",),
    ),
    M(
        "equalize-amax-remeasured",
        "trtq/quantize/equalize.py",
        "    return prepared, {**amax, **new}, notes",
        "    return prepared, dict(amax), notes",
        ("tests/quantize/test_equalize.py",),
    ),
    M(
        "equalize-ranking-reads-users-producers",
        "trtq/pipeline/quantize.py",
        "        producers = output_producers(model)  # the ranking's task inference reads the user's graph",
        "        producers = None",
        ("tests/quantize/test_equalize.py",),
    ),
    # issue 29: outputs declared once per command, checked by one guard, enforced while a command runs
    M(
        "output-inside-an-input-folder",
        "trtq/outputs.py",
        "            if _inside(path, folder):",
        "            if False:",
        (f"{REL}/test_same_path.py",),
    ),
    M(
        "output-matched-by-an-input-glob",
        "trtq/outputs.py",
        "    if glob.has_magic(folder):\n        return fnmatch",
        "    if glob.has_magic(folder):\n        return False\n        return fnmatch",
        (f"{REL}/test_same_path.py",),
    ),
    M(
        "undeclared-writes-refused",
        "trtq/fileio.py",
        "    _check_declared(dest)\n    check_writable_target(dest)",
        "    check_writable_target(dest)",
        (f"{REL}/test_declared_outputs.py",),
    ),
    M(
        "report-output-declared",
        "trtq/cli/commands.py",
        'outputs=[("report", output)],',
        "outputs=[],",
        (f"{REL}/test_declared_outputs.py", f"{REL}/test_same_path.py"),
    ),
    M(
        "merge-stats-inputs-declared",
        "trtq/cli/commands.py",
        'inputs=[("shard file", p) for p in stats]',
        "inputs=[]",
        (f"{REL}/test_same_path.py", f"{REL}/test_declared_outputs.py"),
    ),
    M(
        "keep-batches-declared-as-output",
        "trtq/cli/settings.py",
        'return outputs + [("statistics file", cfg.calibrate.save_stats), ("kept batches file", keep_batches)]',
        'return outputs + [("statistics file", cfg.calibrate.save_stats)]',
        (f"{REL}/test_same_path.py", f"{REL}/test_declared_outputs.py"),
    ),
    M(
        "kept-batches-of-pass-2-an-input",
        "trtq/cli/commands.py",
        '("kept batches file", keep_batches if ranges else None)',
        '("kept batches file", None)',
        (f"{REL}/test_same_path.py", f"{REL}/test_declared_outputs.py"),
    ),
    M(
        "external-data-is-an-input",
        "trtq/outputs.py",
        '            files.extend((f"external data of the {what}", str(p)) for p in external_data_files(model))\n',
        "",
        (f"{REL}/test_same_path.py",),
    ),
    M(
        "users-model-under-a-shape-override",
        "trtq/cli/settings.py",
        "    model = click.get_current_context().meta.get(USER_MODEL_KEY) or cfg.model",
        "    model = cfg.model",
        (f"{REL}/test_same_path.py",),
    ),
    # issue 29: the console script catches signals before it imports the CLI
    M(
        "console-script-early-handlers",
        "trtq/console.py",
        "    install_early_handlers()\n    from trtq.cli import main as cli_main",
        "    from trtq.cli import main as cli_main",
        (f"{REL}/test_console_script.py",),
    ),
    # issue 29: user values (digits 0-9 only, bounded sizes) and click's errors as one line
    M(
        "number-flags-ascii-only",
        "trtq/formatting.py",
        '_ASCII_INT = re.compile(r"[+-]?[0-9]{1,18}")',
        '_ASCII_INT = re.compile(r"[+-]?\\d+")',
        (f"{REL}/test_user_values.py",),
    ),
    M(
        "shape-dims-ascii-only",
        "trtq/input_override.py",
        "        d = ascii_int(part)",
        "        d = int(part) if part.strip().isdigit() else None",
        (f"{REL}/test_user_values.py",),
    ),
    M(
        "max-memory-ascii-only",
        "trtq/calib/collect/budget.py",
        "re.IGNORECASE | re.ASCII)",
        "re.IGNORECASE)",
        (f"{REL}/test_user_values.py",),
    ),
    M(
        "max-memory-bounded",
        "trtq/calib/collect/budget.py",
        "    if not math.isfinite(value) or value * _UNITS[unit] > MAX_SIZE:",
        "    if not math.isfinite(value):",
        (f"{REL}/test_user_values.py",),
    ),
    M(
        "num-bins-bounded",
        "trtq/calib/stats.py",
        "    if not 1 <= int(num_bins) <= MAX_NUM_BINS:",
        "    if int(num_bins) < 1:",
        (f"{REL}/test_user_values.py",),
    ),
    M(
        "override-memory-checked",
        "trtq/input_override.py",
        "    check_run_memory(out, shapes, what)\n",
        "",
        (f"{REL}/test_user_values.py",),
    ),
    M(
        "click-errors-one-line",
        "trtq/cli/process.py",
        "        return click_error(e)",
        "        e.show()\n        return 2",
        (f"{REL}/test_user_values.py",),
    ),
    M(
        "input-paths-unchecked-by-click",
        "trtq/cli/flags.py",
        "IN_PATH = click.Path(readable=False)",
        "IN_PATH = click.Path(dir_okay=False)",
        (f"{REL}/test_user_values.py",),
    ),
    M(
        "every-line-break-escaped",
        "trtq/errors.py",
        "        return text.translate(_LINE_BREAKS)",
        '        return text.replace("\\r", "\\\\r").replace("\\n", "\\\\n")',
        (f"{REL}/test_fuzz.py",),
    ),
    M(
        "nothing-to-rank-is-invalid-input",
        "trtq/compare/sensitivity.py",
        "        raise ModelError(\n",
        "        raise ConfigError(\n",
        (f"{REL}/test_messages.py",),
    ),
    # issue 29: shard metadata bounded and validated; the statistics settings shards must share
    M(
        "shard-count-bounded",
        "trtq/calib/shard.py",
        "    if len(m.group(2)) > 7 or int(m.group(2)) > MAX_SHARDS:",
        "    if False:",
        (f"{REL}/test_user_values.py",),
    ),
    M(
        "shards-at-most-samples",
        "trtq/calib/shard.py",
        "    if shard[1] > batcher.num_samples:",
        "    if False:",
        (f"{REL}/test_shard_metadata.py",),
    ),
    M(
        "shard-count-validated",
        "trtq/calib/shard.py",
        "    if not _whole(count) or not 1 <= count <= MAX_SHARDS:",
        "    if False:",
        (f"{REL}/test_shard_metadata.py",),
    ),
    M(
        "shard-index-validated",
        "trtq/calib/shard.py",
        "    if index is not None and (not _whole(index) or not 0 <= index < count):",
        "    if False:",
        (f"{REL}/test_shard_metadata.py",),
    ),
    M(
        "statistics-key-compared",
        "trtq/calib/shard.py",
        "        check_same_statistics(p, st.meta, p0, st0.meta)\n",
        "",
        (f"{REL}/test_shard_metadata.py",),
    ),
    M(
        "statistics-key-written",
        "trtq/pipeline/calibrate.py",
        '            meta["statistics"] = statistics_key(run.opts.num_bins, run.one_pass, run.opts.hist_elements)',
        "",
        (f"{REL}/test_shard_metadata.py",),
    ),
    # issue 29: provenance covers external data; a signal while merge-stats writes its .npz
    M(
        "external-data-in-the-model-identity",
        "trtq/model.py",
        "    if not files:\n        return own",
        "    if True:\n        return own",
        (f"{REL}/test_external_data.py",),
    ),
    M(
        "signal-cutting-the-npz-is-the-signal",
        "trtq/calib/stats.py",
        "        interrupt.check()  # a SIGINT / SIGTERM cut",
        "        pass  # a SIGINT / SIGTERM cut",
        (f"{REL}/test_signals.py",),
    ),
    # light shape inference: only weights leave the graph; a Reshape's target keeps its values
    M(
        "infer-shapes-keeps-small-initializers",
        "trtq/model.py",
        "        return t.data_type in _FLOAT_TENSOR_TYPES and int(np.prod(t.dims, dtype=np.int64)) >= LIGHT_INITIALIZER",
        "        return True",
        ("tests/test_model_shapes.py",),
    ),
    # ... and the weights it turns into inputs are never calibrated as activations
    M(
        "calibratable-reads-the-real-graph",
        "trtq/model.py",
        "    for spec in input_specs(model):",
        "    for spec in input_specs(inferred):",
        ("tests/test_model_shapes.py",),
    ),
    # a part that reaches the last bin must still report values past the first-pass max (numpy)
    M(
        "histogram-flags-past-top",
        "trtq/calib/collect/kernels.py",
        "                flags |= EXCEEDED",
        "                flags |= 0",
        ("tests/calib/test_kernels.py",),
    ),
    # ... and tasks that reached different ranges are merged at the widest one
    M(
        "pow2-task-ranges-merged",
        "trtq/calib/collect/one_pass.py",
        "            c = regrow(c, self.exponents[name] - exponent)",
        "            pass",
        ("tests/calib/test_one_pass.py",),
    ),
    # a stride that divides a row length samples the same columns (EfficientNet's padding column)
    M(
        "pow2-stride-not-a-dim",
        "trtq/calib/collect/one_pass.py",
        " and all(int(d) % k for d in dims if int(d) > 0):",
        ":",
        ("tests/calib/test_one_pass.py",),
    ),
]


def copy_tree(dest: Path) -> None:
    for name in ("trtq", "tests", "benchmarks", "examples", "sample_data", "configs"):
        src = ROOT / name
        if src.exists():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "setup.py", "conftest.py", "README.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)


def apply(tree: Path, m: Mutation) -> Optional[str]:
    path = tree / m.path
    text = path.read_text()
    count = text.count(m.old)
    if count != 1:
        return f"patch found {count} times in {m.path} (expected once)"
    path.write_text(text.replace(m.old, m.new))
    return None


def rebuild(tree: Path) -> Optional[str]:
    """Compile the patched C kernels in place (the copied library is removed first, so that a
    failed build cannot leave the unpatched one to test)."""
    for lib in (tree / "trtq").rglob("_compiled*.so"):
        lib.unlink()
    p = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, capture_output=True, text=True
    )
    if p.returncode or not any((tree / "trtq").rglob("_compiled*.so")):
        return (
            "the patched trtq/calib/collect/_kernels.c did not build: "
            + (p.stderr.strip().splitlines() or [""])[-1][:200]
        )
    return None


def line_of(m: Mutation) -> int:
    text = (ROOT / m.path).read_text()
    i = text.find(m.old)
    return text.count("\n", 0, i) + 1 if i >= 0 else 0


def run_one(m: Mutation, timeout: float) -> tuple[str, float, str]:
    with tempfile.TemporaryDirectory(prefix="trtq-mutant-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        problem = apply(tree, m)
        if problem:
            return "NO PATCH", 0.0, problem
        if m.path.endswith(".c"):
            problem = rebuild(tree)
            if problem:
                return "NO BUILD", 0.0, problem
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return "killed (timeout)", time.perf_counter() - t0, ""
        seconds = time.perf_counter() - t0
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("FAILED") or ln.startswith("ERROR")]
        if p.returncode == 0:
            return "SURVIVED", seconds, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        if p.returncode in (1, 2) and not lines and "error" in p.stdout.lower() and "collect" in p.stdout.lower():
            return "killed (collection error)", seconds, ""
        return "killed", seconds, (lines[0] if lines else p.stdout.strip().splitlines()[-1])[:110]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the mutations whose name contains this")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not a.only or a.only in m.name]
    if a.list:
        for m in chosen:
            print(f"{m.name:42s} {m.path}:{line_of(m)}")
        return 0
    print(f"{'guard':42s} {'where':34s} {'result':18s} {'s':>6s}  first failing test")
    worst = 0
    for m in chosen:
        result, seconds, detail = run_one(m, a.timeout)
        where = f"{m.path}:{line_of(m)}"
        print(f"{m.name:42s} {where:34s} {result:18s} {seconds:6.1f}  {detail}", flush=True)
        if result == "NO PATCH":
            worst = 2
        elif result == "SURVIVED":
            worst = max(worst, 1)
    killed = sum(1 for _ in chosen)
    print(
        f"({killed} guards; tests run: pytest -x on {REL} (plus the files named per guard) in a patched copy per guard)"
    )
    return worst


if __name__ == "__main__":
    sys.exit(main())

"""Sources: listing folders and file lists, decoding every image mode, .npy shards, bad inputs."""

import pickle

import numpy as np
import pytest
from PIL import Image

from trtq.config import InputSource, PreprocessOptions, ResizeOptions
from trtq.data.sources import (
    IMAGE_EXTENSIONS,
    NpySource,
    SampleError,
    decode_image,
    expand_npy,
    list_image_folder,
    make_source,
    read_file_list,
)
from trtq.errors import ConfigError, DataError

from .helpers import noise_rgb, save_rgb

RAW = PreprocessOptions(scale=1.0, layout="nhwc")  # pixel values as they are, HWC


def load_one(path, shape, preprocess=RAW, dtype="float32"):
    src = make_source("x", InputSource(files=(str(path),), preprocess=preprocess), shape, dtype)
    return src.load(0)


# ------------------------------------------------------------------------------------ listing


def test_folder_listing_recursive_sorted_case_insensitive_hidden_ignored(tmp_path):
    for rel in ["b.JPG", "a/z.png", "a/b/c.webp", "A.Tiff", "c.bmp", "d.jpeg", "e.tif"]:
        save_rgb(
            tmp_path / rel,
            fmt={"jpg": "JPEG", "jpeg": "JPEG", "tiff": "TIFF", "tif": "TIFF"}.get(rel.rsplit(".", 1)[1].lower()),
        )
    save_rgb(tmp_path / ".hidden.png")
    save_rgb(tmp_path / ".cache" / "x.png")
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "model.onnx").write_bytes(b"x")
    assert list_image_folder(tmp_path) == ["A.Tiff", "a/b/c.webp", "a/z.png", "b.JPG", "c.bmp", "d.jpeg", "e.tif"]
    assert set(IMAGE_EXTENSIONS) == {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


def test_missing_and_empty_folder(tmp_path):
    with pytest.raises(DataError, match=r"image folder not found: .*nope; check the data path"):
        list_image_folder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.md").write_text("x")
    save_rgb(tmp_path / "empty" / ".hidden.png")
    with pytest.raises(DataError, match=r"no images in folder .*empty .*hidden files are ignored\); put images there"):
        list_image_folder(tmp_path / "empty")
    save_rgb(tmp_path / "file.png")
    with pytest.raises(DataError, match="is a file, not a folder"):
        list_image_folder(tmp_path / "file.png")


def test_txt_file_list_relative_comments_and_order(tmp_path):
    save_rgb(tmp_path / "imgs" / "b.png", seed=1)
    save_rgb(tmp_path / "imgs" / "a.png", seed=2)
    other = save_rgb(tmp_path / "elsewhere" / "c.jpg", seed=3, fmt="JPEG")
    lst = tmp_path / "lists" / "calib.txt"
    lst.parent.mkdir()
    lst.write_text(f"# calibration images\n../imgs/b.png\n\n   ../imgs/a.png  \n{other}\n")
    root, rel = read_file_list([str(lst)], "data.inputs.x.files")
    assert root == lst.parent
    assert rel == ["../imgs/b.png", "../imgs/a.png", "../elsewhere/c.jpg"]  # order as written
    src = make_source("x", InputSource(files=(str(lst),), preprocess=RAW), (16, 20, 3), "float32")
    np.testing.assert_array_equal(src.load(1), noise_rgb(20, 16, 2))


def test_file_list_missing_entry_names_line(tmp_path):
    lst = tmp_path / "l.txt"
    save_rgb(tmp_path / "ok.png")
    lst.write_text("ok.png\n# fine\nmissing.png\n")
    with pytest.raises(DataError, match=r"l\.txt:3: listed image not found: .*missing\.png"):
        read_file_list([str(lst)], "k")
    with pytest.raises(DataError, match="listed image not found"):
        read_file_list([str(tmp_path / "ok.png"), str(tmp_path / "gone.png")], "data.inputs.x.files")
    with pytest.raises(DataError, match="file list not found"):
        read_file_list([str(tmp_path / "none.txt")], "k")
    with pytest.raises(ConfigError, match="must be the only entry"):
        read_file_list([str(lst), str(tmp_path / "ok.png")], "k")


def test_explicit_files_keep_given_order(tmp_path):
    a = save_rgb(tmp_path / "x" / "a.png", seed=5)
    b = save_rgb(tmp_path / "y" / "b.png", seed=6)
    root, rel = read_file_list([str(b), str(a)], "k")
    assert root == tmp_path and rel == ["y/b.png", "x/a.png"]


def test_source_must_name_exactly_one_kind(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of images, files, npy .*none"):
        make_source("x", InputSource(), (3, 8, 8), "float32")
    with pytest.raises(ConfigError, match="images and npy"):
        make_source("x", InputSource(images=str(tmp_path), npy=("a.npy",)), (3, 8, 8), "float32")


# ------------------------------------------------------------------------------------ decoding


def test_grayscale_is_replicated_for_rgb(tmp_path):
    gray = np.arange(48, dtype=np.uint8).reshape(6, 8) * 5
    Image.fromarray(gray).save(tmp_path / "g.png")
    got = load_one(tmp_path / "g.png", (6, 8, 3))
    for c in range(3):
        np.testing.assert_array_equal(got[..., c], gray)
    loaded = load_one(tmp_path / "g.png", (6, 8, 1), PreprocessOptions(color="gray", scale=1.0, layout="nhwc"))
    assert loaded[..., 0].tolist() == gray.tolist()


def test_rgba_and_la_drop_alpha(tmp_path):
    rgb = noise_rgb(5, 4, 1)
    alpha = np.zeros((4, 5, 1), np.uint8)  # fully transparent: values must survive untouched
    Image.fromarray(np.concatenate([rgb, alpha], axis=2), "RGBA").save(tmp_path / "a.png")
    np.testing.assert_array_equal(load_one(tmp_path / "a.png", (4, 5, 3)), rgb)
    la = Image.fromarray(np.stack([rgb[..., 0], alpha[..., 0]], axis=2), "LA")
    la.save(tmp_path / "la.png")
    got = load_one(tmp_path / "la.png", (4, 5, 3))
    np.testing.assert_array_equal(got[..., 2], rgb[..., 0])


def test_palette_uses_its_palette(tmp_path):
    idx = np.array([[0, 1, 2], [2, 1, 0]], np.uint8)
    img = Image.fromarray(idx, "P")
    palette = [10, 20, 30, 200, 100, 50, 0, 255, 128] + [0] * (256 * 3 - 9)
    img.putpalette(palette)
    img.save(tmp_path / "p.png")
    colors = np.array(palette[:9]).reshape(3, 3)
    np.testing.assert_array_equal(load_one(tmp_path / "p.png", (2, 3, 3)), colors[idx])


def test_cmyk_is_converted_to_rgb(tmp_path):
    # inks fully on or off, where every CMYK -> RGB formula agrees: R = 255 only if C = 0 and K = 0
    cmyk = (np.random.default_rng(0).integers(0, 2, (4, 6, 4)) * 255).astype(np.uint8)
    Image.fromarray(cmyk, "CMYK").save(tmp_path / "c.tif")
    expected = np.where((cmyk[..., :3] == 0) & (cmyk[..., 3:4] == 0), 255, 0)
    np.testing.assert_array_equal(load_one(tmp_path / "c.tif", (4, 6, 3)), expected)


def test_16bit_png_maps_to_8bit_range_as_float(tmp_path):
    values = np.array([[0, 257, 1000], [65535, 30000, 12345]], np.uint16)
    Image.fromarray(values).save(tmp_path / "d.png")
    assert Image.open(tmp_path / "d.png").mode in ("I;16", "I")
    got = load_one(tmp_path / "d.png", (2, 3, 1), PreprocessOptions(color="gray", scale=1.0, layout="nhwc"))
    np.testing.assert_allclose(got[..., 0], values / 257.0, rtol=1e-6)


def test_float_and_int32_tiff(tmp_path):
    f = np.array([[0.25, -1.5], [3.0, 100.0]], np.float32)
    Image.fromarray(f).save(tmp_path / "f.tif")
    got = load_one(tmp_path / "f.tif", (2, 2, 1), PreprocessOptions(color="gray", scale=1.0, layout="nhwc"))
    np.testing.assert_array_equal(got[..., 0], f)
    i = np.array([[0, 70000], [5, 1]], np.int32)
    Image.fromarray(i).save(tmp_path / "i.tif")
    got = load_one(tmp_path / "i.tif", (2, 2, 1), PreprocessOptions(color="gray", scale=1.0, layout="nhwc"))
    np.testing.assert_array_equal(got[..., 0], i)


def test_exif_orientation_is_applied(tmp_path):
    arr = np.zeros((20, 40, 3), np.uint8)  # stored 40 wide x 20 high
    arr[:10, :10] = (255, 0, 0)  # red block at the stored top-left corner
    img = Image.fromarray(arr)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    img.save(tmp_path / "r.jpg", exif=exif, quality=95)
    decoded = decode_image(str(tmp_path / "r.jpg"))
    assert decoded.size == (20, 40)  # width, height swapped
    px = np.asarray(decoded)
    assert px[2, 17, 0] > 200 and px[2, 17, 1] < 60  # stored top-left is now the top-right
    assert px[37, 2, 0] < 60


def test_corrupt_and_truncated_images(tmp_path):
    (tmp_path / "junk.jpg").write_bytes(b"this is not a jpeg at all" * 10)
    with pytest.raises(DataError, match=r"cannot decode image .*junk\.jpg: .*; remove it or pass --skip-bad"):
        decode_image(str(tmp_path / "junk.jpg"))
    good = save_rgb(tmp_path / "full.jpg", 64, 64, fmt="JPEG")
    data = good.read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(SampleError, match=r"cannot decode image .*cut\.jpg") as info:
        decode_image(str(tmp_path / "cut.jpg"))
    assert info.value.skippable and info.value.path.endswith("cut.jpg")
    png = save_rgb(tmp_path / "full.png", 64, 64).read_bytes()
    (tmp_path / "cut.png").write_bytes(png[: len(png) - 200])
    with pytest.raises(DataError, match=r"cannot decode image .*cut\.png"):
        decode_image(str(tmp_path / "cut.png"))


def test_wrong_preprocessed_shape_names_the_option(tmp_path):
    save_rgb(tmp_path / "a.png", 20, 16)
    opts = PreprocessOptions(resize=ResizeOptions(mode="exact", size=(16, 16)))
    with pytest.raises(
        DataError,
        match=r"image .*a\.png preprocesses to \[3, 16, 16\] but input x expects "
        r"\[3, 8, 8\]; set data\.inputs\.x\.preprocess\.center_crop or "
        r"data\.inputs\.x\.preprocess\.resize",
    ):
        load_one(tmp_path / "a.png", (3, 8, 8), opts)
    with pytest.raises(DataError, match=r"set data\.inputs\.x\.preprocess\.layout: nhwc"):
        load_one(tmp_path / "a.png", (16, 20, 3), PreprocessOptions())
    with pytest.raises(DataError, match=r"preprocess\.color: gray"):
        load_one(tmp_path / "a.png", (1, 16, 20), PreprocessOptions())


# ------------------------------------------------------------------------------------ .npy


def test_npy_shards_globs_sorted_and_cast(tmp_path):
    a = np.arange(2 * 3, dtype=np.float64).reshape(2, 3)
    b = np.arange(3 * 3, dtype=np.float64).reshape(3, 3) + 100
    np.save(tmp_path / "s1.npy", b)
    np.save(tmp_path / "s0.npy", a)
    files = expand_npy([str(tmp_path / "s*.npy")], "k")
    assert [f.name for f in files] == ["s0.npy", "s1.npy"]
    src = make_source("x", InputSource(npy=(str(tmp_path / "s*.npy"),)), (3,), "float32")
    assert len(src) == 5
    assert src.load(0).dtype == np.float32
    np.testing.assert_array_equal(np.stack([src.load(i) for i in range(5)]), np.concatenate([a, b]))
    assert src.label(3) == f"{tmp_path / 's1.npy'}[1]"


def test_npy_is_memory_mapped(tmp_path):
    np.save(tmp_path / "m.npy", np.zeros((4, 2), np.float32))
    src = NpySource("x", [tmp_path / "m.npy"], (2,), "float32", "k")
    assert isinstance(src._map(0), np.memmap)


def test_workers_asking_for_a_new_file_at_once_map_it_once(tmp_path, monkeypatch):
    """Decode workers reach a file's first sample together: one of them opens it, the others wait
    for that map (three threads opening one file at once once made np.load raise SystemError)."""
    import threading
    import time

    np.save(tmp_path / "m.npy", np.zeros((8, 2), np.float32))
    src = NpySource("x", [tmp_path / "m.npy"], (2,), "float32", "k")
    opened, real_open = [], NpySource._open

    def slow_open(self, path):
        opened.append(path)
        time.sleep(0.05)
        return real_open(self, path)

    monkeypatch.setattr(NpySource, "_open", slow_open)
    start = threading.Barrier(4)
    maps = []

    def worker(row):
        start.wait()
        maps.append(src._map(0))
        src.load(row)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 1 and len(maps) == 4 and all(m is maps[0] for m in maps)


def test_npy_glob_matching_nothing_and_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"the pattern .*\*\.npy matches no files"):
        expand_npy([str(tmp_path / "*.npy")], "data.inputs.x.npy")
    with pytest.raises(DataError, match=r"\.npy file not found"):
        expand_npy([str(tmp_path / "none.npy")], "data.inputs.x.npy")


def test_npy_wrong_shape_and_rank(tmp_path):
    np.save(tmp_path / "w.npy", np.zeros((4, 3, 16, 16), np.float32))
    with pytest.raises(
        DataError,
        match=r"w\.npy holds samples of shape \[3, 16, 16\] \(array \[4, 3, 16, 16\]\) but "
        r"input x expects samples of shape \[3, 8, 8\]; .* \[N, 3, 8, 8\]",
    ):
        make_source("x", InputSource(npy=(str(tmp_path / "w.npy"),)), (3, 8, 8), "float32")
    np.save(tmp_path / "one.npy", np.zeros((3, 8, 8), np.float32))
    with pytest.raises(DataError, match=r"single sample: save it with a leading sample axis"):
        make_source("x", InputSource(npy=(str(tmp_path / "one.npy"),)), (3, 8, 8), "float32")
    np.save(tmp_path / "s.npy", np.float32(1.0))
    with pytest.raises(DataError, match="holds a scalar"):
        make_source("x", InputSource(npy=(str(tmp_path / "s.npy"),)), (3,), "float32")


def test_npy_object_and_pickle_rejected(tmp_path):
    np.save(tmp_path / "o.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(
        DataError, match=r"pickled/object \.npy not supported; save with np\.save\(arr\) of a numeric array"
    ):
        make_source("x", InputSource(npy=(str(tmp_path / "o.npy"),)), (), "float32")
    (tmp_path / "p.npy").write_bytes(pickle.dumps(np.zeros(3)))
    with pytest.raises(DataError, match=r"pickled/object \.npy not supported"):
        make_source("x", InputSource(npy=(str(tmp_path / "p.npy"),)), (), "float32")


def test_npy_dtype_checks(tmp_path):
    np.save(tmp_path / "c.npy", np.zeros((2, 3), np.complex64))
    with pytest.raises(DataError, match="complex64, which cannot be cast to float32"):
        make_source("x", InputSource(npy=(str(tmp_path / "c.npy"),)), (3,), "float32")
    np.save(tmp_path / "u.npy", np.array([["a", "b", "c"]]))
    with pytest.raises(DataError, match="not numeric"):
        make_source("x", InputSource(npy=(str(tmp_path / "u.npy"),)), (3,), "float32")
    np.save(tmp_path / "f.npy", np.zeros((2, 3), np.float32))
    with pytest.raises(DataError, match="float32, which cannot be cast to int64"):
        make_source("x", InputSource(npy=(str(tmp_path / "f.npy"),)), (3,), "int64")
    np.save(tmp_path / "i.npy", np.arange(6, dtype=np.uint8).reshape(2, 3))
    src = make_source("x", InputSource(npy=(str(tmp_path / "i.npy"),)), (3,), "float32")
    assert src.load(1).tolist() == [3.0, 4.0, 5.0]


def test_npy_corrupt_truncated_and_npz(tmp_path):
    np.save(tmp_path / "t.npy", np.zeros((100, 10), np.float32))
    data = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"corrupt or truncated \.npy file .*t\.npy"):
        make_source("x", InputSource(npy=(str(tmp_path / "t.npy"),)), (10,), "float32")
    (tmp_path / "h.npy").write_bytes(data[:20])
    with pytest.raises(DataError, match=r"corrupt or truncated \.npy file .*h\.npy"):
        make_source("x", InputSource(npy=(str(tmp_path / "h.npy"),)), (10,), "float32")
    (tmp_path / "g.npy").write_bytes(b"hello world, not numpy")
    with pytest.raises(DataError, match=r"g\.npy is not an \.npy file"):
        make_source("x", InputSource(npy=(str(tmp_path / "g.npy"),)), (10,), "float32")
    np.savez(tmp_path / "z.npy", a=np.zeros(3))
    with pytest.raises(DataError, match=r"\.npz archive"):
        make_source("x", InputSource(npy=(str(tmp_path / "z.npy.npz"),)), (10,), "float32")


def test_npy_nan_names_file_and_sample(tmp_path):
    arr = np.zeros((4, 2), np.float32)
    arr[2, 1] = np.inf
    np.save(tmp_path / "n.npy", arr)
    src = make_source("x", InputSource(npy=(str(tmp_path / "n.npy"),)), (2,), "float32")
    src.load(1)
    with pytest.raises(DataError, match=r"n\.npy sample 2 has NaN or Inf values"):
        src.load(2)


def _mapped_rss_kib(path) -> int:
    """Resident KiB of this process's memory maps of ``path`` (from /proc/self/smaps).

    Only the file's own mappings count: the process's total RssFile also grows whenever any
    shared library is paged in meanwhile, which says nothing about the reader.
    """
    target, total, inside = str(path), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = line.rstrip("\n").endswith(target)
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs Linux /proc")
def test_npy_reads_do_not_pile_up_in_rss(tmp_path):
    rows = np.ones((64, 160_000), np.float32)  # 40 MB
    path = tmp_path / "big.npy"
    np.save(path, rows)
    del rows
    src = make_source("x", InputSource(npy=(str(path),)), (160_000,), "float32")
    total = sum(float(src.load(i)[0]) for i in range(len(src)))
    assert total == 64.0
    peak = _mapped_rss_kib(path)
    assert peak < 8 * 1024, f"{peak} KiB of the 40 MB file stay resident in this process after reading it"
    # the measurement itself can see a resident map: a plain memory map read whole shows ~40,000 KiB
    plain = np.load(path, mmap_mode="r")
    assert float(plain.sum()) == 64 * 160_000
    assert _mapped_rss_kib(path) > 30 * 1024
    del plain
    src.close()

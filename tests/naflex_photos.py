"""Real photos at many aspect ratios for the NaFlex tests and benchmark: the scikit-image and
scikit-learn photos whole, cut to wide, tall and extreme strips, a small crop (upscaled by the
rule), and the webdataset test data's PNGs; each encoded as a JPEG (quality 90) or a PNG."""

from __future__ import annotations

import io
import os
import tarfile

from corpus import _photos_rgb

TESTDATA = "/work/shared/data/webdataset-testdata/testgz.tar"
if not os.path.exists(TESTDATA):  # the repository's copy, where the shared one is absent
    TESTDATA = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "webdataset-testdata", "testgz.tar"
    )

# (left, top, width, height) as fractions of a photo: whole, wide, tall, strips, a small corner.
CUTS = [
    (0.0, 0.0, 1.0, 1.0),
    (0.0, 0.3, 1.0, 0.25),
    (0.4, 0.0, 0.2, 1.0),
    (0.0, 0.5, 1.0, 0.03),
    (0.5, 0.0, 0.02, 1.0),
    (0.1, 0.1, 0.06, 0.05),
]


def encode(img, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def photo_images() -> list[tuple[str, bytes]]:
    """(name, encoded image) of every cut of every photo, and the test data's PNGs."""
    out = []
    for i, photo in enumerate(_photos_rgb()):
        w, h = photo.size
        for j, (fx, fy, fw, fh) in enumerate(CUTS):
            box = (
                int(fx * w),
                int(fy * h),
                int(fx * w) + max(1, int(fw * w)),
                int(fy * h) + max(1, int(fh * h)),
            )
            fmt = "PNG" if (i + j) % 4 == 0 else "JPEG"
            out.append((f"p{i}c{j}", encode(photo.crop(box), fmt)))
    if os.path.exists(TESTDATA):
        with tarfile.open(TESTDATA) as tar:
            pngs = [m for m in tar.getmembers() if m.name.endswith(".png")][:4]
            for m in pngs:
                out.append((f"wds{os.path.basename(m.name)[:-4]}", tar.extractfile(m).read()))
    return out

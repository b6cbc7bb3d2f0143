"""Building and materializing OCI images: preparation and packaging only.

Pull by digest (skopeo or crane), verify every blob and every layer's
diff_id, and materialize one root filesystem per image with a layer applier
that never writes outside its root (scripts/prepare_images.py); write
images without Docker (the demo images of tools/). The services load none
of this: they read the materialized list through camg.oci.images, and
import-linter forbids camg/ and environments/ to import tools/.
"""

"""Building and materializing OCI images: preparation and packaging only.

Pull by digest (skopeo or crane), verify every blob and every layer's
diff_id, and materialize one root filesystem per image with a layer applier
that never writes outside its root (scripts/prepare_images.py); build
images without Docker (build.py, the one image builder: the demo images of
tools/oci_demo.py and any repository's, ``python -m tools.prepare_image``).
The services load none of this: they read the materialized list through
camg.oci.images, and import-linter forbids camg/ and the services' modules
to import tools/.
"""

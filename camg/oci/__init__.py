"""OCI images as the services see them: the image list and the materialized
result (camg.oci.images). Pulling, verifying and materializing are operator
steps (tools/oci/, scripts/prepare_images.py); services only read the result.
"""

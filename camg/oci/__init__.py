"""OCI images for the Coding environment.

Pull by digest (skopeo or crane), verify every blob and every layer's
diff_id, and materialize one root filesystem per image with a layer applier
that never writes outside its root. Materialization is an operator step
(scripts/prepare_images.py); services only read the result.
"""

"""The configuration chain: typed service configs, prepared task manifests,
the content hashes that bind them to installed bytes, and what preparation
uses to write them (private directories, progress lines)."""

"""Size limits shared by the policy and the serializer, in a module that imports nothing."""

__all__ = ["DEFAULT_MAX_RESULT_BYTES"]

#: The largest stored result (tag and encoded payload), in bytes: 1 MiB.
DEFAULT_MAX_RESULT_BYTES = 1 << 20

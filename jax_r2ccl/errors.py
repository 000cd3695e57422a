"""The one error type of jax_r2ccl: a sentence, a cause and the peer it concerns."""


class R2cclError(RuntimeError):
    """Raised for every failure of jax_r2ccl.

    Attributes:
      cause: one of "invalid_argument", "timeout", "all_rails_down", "peer_gone",
        "protocol", "mismatch", "system", "closed", "device" (a CUDA call failed),
        "internal" (a bug: an unexpected exception caught at the FFI boundary).
      peer: the rank the failure concerns, or -1.
    """

    def __init__(self, message: str, cause: str = "invalid_argument", peer: int = -1):
        super().__init__(message)
        self.cause = cause
        self.peer = peer

    def __reduce__(self):
        return (R2cclError, (str(self), self.cause, self.peer))

"""An example third-party specdec method: ``echo`` drafts the request's last token, repeated.

It is deliberately trivial; it shows the whole shape of a method plugin built on specdec's
public API only: a config class extending :class:`specdec.SpeculativeConfig`, registration
under a name and aliases, and a drafter hook returning :class:`specdec.DraftProposal`.
"""

from specdec_echo_example.config import EchoDecodingConfig

__all__ = ["EchoDecodingConfig"]

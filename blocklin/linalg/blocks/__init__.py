"""The shared tall-block toolbox: pieces every pass-based algorithm uses, none of them an operation."""

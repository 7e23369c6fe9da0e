"""``specdec train redrafter``: a recurrent drafter on a frozen target, in Apple's layout."""

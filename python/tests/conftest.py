import os
import sys

# Import the package from this checkout (python/squall) unless told otherwise.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(0, _HERE)
